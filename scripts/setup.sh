#!/usr/bin/env bash
# Installs the Debian packages linnet-tp builds with. Idempotent: prints nothing and
# touches nothing when every package is already there.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libopenmpi-dev openmpi-bin
  libcxxopts-dev nlohmann-json3-dev
  libcpp-httplib-dev
  libgtest-dev
  libicu-dev libpcre2-dev
  iproute2
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
