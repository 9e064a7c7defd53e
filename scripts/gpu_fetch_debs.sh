#!/usr/bin/env bash
# Downloads (here, where apt works) the Debian packages that scripts/gpu_check.sh needs
# on the device machine, which has nvcc, CMake and Python but none of our build
# dependencies and no network. They land in .debs/ (ignored by git via
# .git/info/exclude); gpu_check.sh unpacks them with `dpkg -x` into a private prefix,
# never into /. Pass `.debs` in the device run's `carry` list.
#
# The list: our build dependencies (scripts/setup.sh) and their shared-library
# dependencies that a CUDA image may lack, minus the base system (libc, libstdc++, gcc).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  # Open MPI 4.1 (headers, libmpi, mpirun/orted) and its runtime libraries
  libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common
  libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0
  libpsm2-2 libpsm-infinipath1 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
  libmunge2 libnuma1 libltdl7 libpciaccess0
  # header-only libraries
  nlohmann-json3-dev libcxxopts-dev
  # OpenBLAS (pthread flavour, as openblas.pc names it) and the Fortran runtime it needs
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
  # OpenMP runtime: the CPU kernels' thread teams (libgomp)
  libgomp1
  # tokenizer: ICU and PCRE2
  libicu-dev libicu72 libpcre2-dev libpcre2-8-0
  # GoogleTest (static libraries + CMake config) and pkg-config
  libgtest-dev pkgconf pkgconf-bin libpkgconf3
)

mkdir -p .debs
grep -qxF '/.debs/' .git/info/exclude 2>/dev/null || echo '/.debs/' >> .git/info/exclude
cd .debs
rm -f ./*.deb
apt-get download "${PACKAGES[@]}" >/dev/null
echo "gpu_fetch_debs: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in .debs/"
