#!/usr/bin/env bash
# Downloads (here, where apt works) the Debian packages that scripts/gpu_check.sh needs on
# the device machine, which has nvcc, CMake and Python but none of our packages and no
# network. gpu_check.sh unpacks them with `dpkg -x` into a private prefix, never into /.
#
#   scripts/gpu_fetch_debs.sh DIR                 # runtime libraries of the carried binaries
#   scripts/gpu_fetch_debs.sh DIR --build-deps    # and what building there needs (gpu_check --build)
#
# The runtime list is every shared library that linnet-tp, the test binaries,
# compare_backends, mpirun and orted load, minus the C and C++ runtime every Linux has
# (libc6, libstdc++6, libgcc-s1) and minus CUDA's own (cuBLASLt, NCCL: the device's
# toolkit). `gpu_check.sh prepare` checks each binary with ldd against the unpacked prefix
# alone and names any library this list misses.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:?usage: gpu_fetch_debs.sh DIR [--build-deps]}
BUILD_DEPS=0
[ "${2:-}" = --build-deps ] && BUILD_DEPS=1

PACKAGES=(
  # Open MPI 4.1 (libmpi, mpirun/orted, help files) and the libraries it and its plugins load
  libopenmpi3 openmpi-bin openmpi-common
  libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0
  libpsm2-2 libpsm-infinipath1 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
  libmunge2 libnuma1 libltdl7 libpciaccess0 libudev1 libatomic1 libuuid1 zlib1g
  # OpenMP runtime: the CPU kernels' thread teams (libgomp)
  libgomp1
  # tokenizer: ICU and PCRE2
  libicu72 libpcre2-8-0
  # serve: cpp-httplib (built with OpenSSL, zlib and Brotli)
  libcpp-httplib0.11 libssl3 libbrotli1
)
if [ "$BUILD_DEPS" = 1 ]; then
  PACKAGES+=(
    libopenmpi-dev nlohmann-json3-dev libcxxopts-dev libicu-dev libpcre2-dev libgtest-dev
    libcpp-httplib-dev libssl-dev libbrotli-dev zlib1g-dev pkgconf pkgconf-bin libpkgconf3
  )
fi

mkdir -p "$DEST"
cd "$DEST"
rm -f ./*.deb
if ! apt-get download "${PACKAGES[@]}" >/dev/null 2>download.err; then
  # A fresh machine may have no package lists yet.
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  apt-get download "${PACKAGES[@]}" >/dev/null
fi
rm -f download.err
echo "gpu_fetch_debs: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in $DEST"
