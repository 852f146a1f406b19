-- wrk script of `make bench`: the same request stream for every server.
-- BENCH_MODE: unique (a new checkout_sha per request), dup (one event), alerts (BENCH_ALERTS
-- firing alerts per payload, new fingerprints per request). BENCH_PREFIX keeps runs apart.
local mode = os.getenv("BENCH_MODE") or "unique"
local prefix = os.getenv("BENCH_PREFIX") or "p"
local token = os.getenv("BENCH_TOKEN") or ""
local nalerts = tonumber(os.getenv("BENCH_ALERTS") or "1000")
local path = mode == "alerts" and "/webhook/alerts" or "/webhook/scm"

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
if token ~= "" then
  wrk.headers["X-Scm-Token"] = token
  wrk.headers["X-Scm-Event"] = "Push Hook"
end

local counter = 0
function setup(thread)
  counter = counter + 1
  thread:set("tid", counter)
end

local n = 0
local function push(sha)
  return '{"ref":"refs/heads/main","project":{"path_with_namespace":"bench/app"},"checkout_sha":"' .. sha .. '"}'
end

function request()
  n = n + 1
  local body
  if mode == "dup" then
    body = push(prefix)
  elseif mode == "unique" then
    body = push(prefix .. "-" .. tid .. "-" .. n)
  else
    local parts = {}
    for i = 1, nalerts do
      parts[i] = '{"status":"firing","fingerprint":"' .. prefix .. "-" .. tid .. "-" .. n .. "-" .. i ..
        '","labels":{"alertname":"BenchStorm","severity":"page"},"annotations":{"summary":"bench storm alert"}}'
    end
    body = '{"version":"4","status":"firing","alerts":[' .. table.concat(parts, ",") .. ']}'
  end
  return wrk.format(nil, path, nil, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"socket_errors":%d,"non2xx":%d,"timeouts":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
