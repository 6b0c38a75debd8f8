#!/usr/bin/env bash
# Installs every Debian package chorus needs to build, test and run its demo.
# Safe to run again: packages already present are left alone and nothing is downloaded
# except through apt from Debian's archive.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  # compiles through ccache when present (CMakeLists.txt: CHORUS_CCACHE)
  ccache
  libuv1-dev
  libflatbuffers-dev flatbuffers-compiler
  libeigen3-dev
  libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libtomlplusplus-dev libspdlog-dev libfmt-dev
  zlib1g-dev libsodium-dev
  # node/frame_cipher: OpenSSL's EVP ChaCha20-Poly1305 seals frames (docs/security.md)
  libssl-dev
  gnuplot-nox
  # bench/soak.sh plots RSS, fds and connections per node (docs/soak.md)
  python3-matplotlib
  dataset-fashion-mnist
  # make fuzz: clang with libFuzzer (tests/fuzz); .ci/run checks formatting with clang-format
  clang libclang-rt-14-dev clang-format
  # tests/cli runs a job under mpirun whose rank crashes (docs/stragglers.md)
  openmpi-bin
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages chorus needs are installed."
  exit 0
fi

echo "setup: installing ${#missing[@]} missing Debian package(s): ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
  else
    echo "setup: error: not root and no sudo; run as root: apt-get install ${missing[*]}" >&2
    exit 1
  fi
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet; refresh them once before installing.
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done."
