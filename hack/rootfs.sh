#!/bin/sh
# Assembles the root filesystem of opsgate's runtime images under $1 from the image this runs in
# (the Dockerfile's rootfs stage, on NODE_IMAGE): only what Node needs to run the app.
#
#   /usr/local/bin/node            stripped of its symbol table and debug info (.dynsym stays)
#   the libraries `ldd node` names and the dynamic loader, at their real paths, plus the /lib* links
#   /etc/ssl/certs/ca-certificates.crt   Debian's CA set (package ca-certificates) and nothing else
#   /usr/share/zoneinfo            tzdata
#   /etc/passwd, /etc/group        root and node (UID/GID 1000); /etc/nsswitch.conf (files, then DNS)
#   /etc/os-release, /var/lib/dpkg/status.d/<package>
#                                  the Debian release and the packages those files come from, in the
#                                  layout distroless uses, so image scanners and SBOM tools see them
#   /tmp (1777), /app, /home/node
# It ends by running the copied node in a chroot of the result: a missing library fails the build.
set -eu

r=${1:?usage: rootfs.sh <dir>}
node=$(command -v node)
mkdir -p "$r/usr/local/bin" "$r/etc/ssl/certs" "$r/usr/share" "$r/tmp" "$r/app" "$r/home/node" "$r/var/lib/dpkg/status.d"

# 150 MB with symbols, 116 MB without; native addons link against .dynsym, which strip keeps.
strip -o "$r/usr/local/bin/node" "$node"
chmod 0755 "$r/usr/local/bin/node"

files="$node"
for lib in $(ldd "$node" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
  # Debian merges /lib into /usr/lib: each file goes under its directory's real path, by the name
  # ldd gives (the soname), and the top-level links below make the names ldd prints resolve.
  dir=$(realpath "$(dirname "$lib")")
  mkdir -p "$r$dir"
  cp -L "$lib" "$r$dir/"
  files="$files $(realpath "$lib")"
done
for l in /lib /lib32 /lib64 /libx32; do
  if [ -L "$l" ]; then ln -s "$(readlink "$l")" "$r$l"; fi
done

# Only the certificates the ca-certificates package ships: a build machine's own CAs (a TLS-inspecting
# proxy's, added to the build base) stay out of the image.
cat /usr/share/ca-certificates/mozilla/*.crt >"$r/etc/ssl/certs/ca-certificates.crt"
cp -a /usr/share/zoneinfo "$r/usr/share/zoneinfo"

printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnode:x:1000:1000:node:/home/node:/usr/sbin/nologin\n' >"$r/etc/passwd"
printf 'root:x:0:\nnode:x:1000:\n' >"$r/etc/group"
# Without this file glibc asks DNS before /etc/hosts and stops at its NXDOMAIN for names like localhost.
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$r/etc/nsswitch.conf"
chmod 1777 "$r/tmp"
chown 1000:1000 "$r/home/node"
chmod 0750 "$r/home/node"

cp -L /etc/os-release "$r/etc/os-release"
pkgs=$(for f in $files /usr/share/zoneinfo/UTC /usr/share/ca-certificates; do dpkg -S "$(realpath "$f")" 2>/dev/null || dpkg -S "$f" 2>/dev/null || true; done \
  | sed 's/:[^:]*$//; s/, /\n/g' | sed 's/:.*//' | sort -u)
for p in $pkgs; do dpkg-query -s "$p" >"$r/var/lib/dpkg/status.d/$p"; done

chroot "$r" /usr/local/bin/node -e '
  const tls = require("node:tls");
  if (tls.rootCertificates.length === 0) process.exit(1);
  new Intl.DateTimeFormat("en", { timeZone: "Europe/Paris" }).format(0);
' || { echo "rootfs.sh: node does not run on the copied files alone" >&2; exit 1; }
echo "rootfs.sh: node $("$r/usr/local/bin/node" --version), packages: $(echo $pkgs)"
