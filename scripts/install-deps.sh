#!/bin/sh
# Install what building and testing libfastreduce needs on Debian 12 (root).
# Only missing packages are installed; a second run is quick.
set -e
PKGS="build-essential autoconf automake libtool pkg-config libcmocka-dev
libibverbs-dev librdmacm-dev libhwloc-dev valgrind"
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
		missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "install-deps: installing$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing
fi
