#!/bin/sh
# The installed fio's own source, configured, in $1: what c/fio/ssdemu_fio.c is compiled
# against (an external engine must match the fio that loads it: FIO_IOOPS_VERSION and the
# layouts of thread_data and io_u), as SPDK builds its plugin against fio's tree.  Debian's
# source package of the installed version, through apt; its deb-src line is added (a file
# of its own under /etc/apt/sources.list.d) when the machine has none.
set -eu
dest=$(realpath -m "$1")
version=$(dpkg-query -W -f='${Version}' fio)
upstream=${version%-*}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi
cd "$work"
if ! apt-get source -qq --download-only "fio=$version" >/dev/null 2>&1; then
  . /etc/os-release
  echo "ssdemu: adding Debian's source packages ($VERSION_CODENAME) to apt for fio's source"
  printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$VERSION_CODENAME" | $SUDO tee /etc/apt/sources.list.d/ssdemu-deb-src.sources >/dev/null
  $SUDO apt-get update -qq
  apt-get source -qq --download-only "fio=$version" >/dev/null 2>&1
fi
dpkg-source -x --no-check fio_*.dsc src >/dev/null
cd src
./configure --disable-native >configure.log 2>&1 || { tail configure.log >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$work/src" "$dest"
echo "fio $upstream source configured in $dest"
