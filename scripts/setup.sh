#!/usr/bin/env bash
# Set up kernel_env in ./.venv: what `make demo` and `make test` run first.
#
#   scripts/setup.sh              kernel_env and its base dependencies: all `make demo` needs
#   scripts/setup.sh test [...]   with these extras of pyproject.toml too (`make test`: test, which
#                                 holds every other extra's packages and pytest)
#
#   1. system tools: bubblewrap (the sandbox), ripgrep (the Grep tool), g++ (cpp/cuda builds);
#      installed with apt-get when missing and we are root, else a note says what is missing
#   2. a Python 3.12: $PYTHON, python3.12 on PATH, pyenv's 3.12.*, /usr/bin/python3.12
#   3. .venv: with --system-site-packages when that Python already has a usable torch (a GPU
#      machine's CUDA build is kept, never replaced)
#   4. torch: kept if importable at >= $TORCH_MIN, else $TORCH_SPEC (torch==2.13.0) is installed;
#      TORCH_SPEC is pip's arguments, split at spaces, so a machine without a GPU can take the
#      CPU-only wheel (no CUDA libraries) in a fresh venv:
#        TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu' make setup
#   5. pip install -e '.[EXTRAS]' (-e . without extras)
#
# Idempotent and fast: a stamp in .venv keyed on pyproject.toml and the Python used, which lists
# the extras installed, skips steps 3-5 when nothing changed and the extras asked for are there (a
# venv set up for the tests serves the demo; the demo's gets the test extras added). Never asks
# questions (CI has no stdin). Shows its progress: a line per step with the seconds since the
# start, and pip's own output (a line per package it collects, downloads and installs; its
# download bar on a terminal), so a log is never silent for the minutes torch takes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TORCH_MIN=${TORCH_MIN:-2.11}
STAMP="$VENV/.kernel_env-setup"

# Bold on a terminal; plain in a log (no escape codes in CI output).
if [ -t 1 ]; then BOLD=$'\033[1m' RED=$'\033[1;31m' PLAIN=$'\033[0m'; else BOLD='' RED='' PLAIN=''; fi
say() { printf '%s[setup %4ss]%s %s\n' "$BOLD" "$SECONDS" "$PLAIN" "$*"; }
die() { printf '%s[setup] error:%s %s\n' "$RED" "$PLAIN" "$*" >&2; exit 2; }

# pip install with its progress: on a terminal pip as it is (its bar); in a log one line per
# package, without the bar's redraws and the "Requirement already satisfied" lines of what is there.
pip_install() {
  if [ -t 1 ]; then
    "$PY" -m pip install --disable-pip-version-check "$@"
  else
    "$PY" -m pip install --disable-pip-version-check --progress-bar off "$@" 2>&1 \
      | { grep -v '^Requirement already satisfied' || true; }
  fi
}

# ----------------------------------------------------------------------------- 1. system tools
system_tools() {
  local missing=() pair cmd pkg
  for pair in bwrap:bubblewrap rg:ripgrep g++:g++; do
    cmd=${pair%%:*} pkg=${pair#*:}
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing ${missing[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    say "NOTE: missing ${missing[*]} and not root (or no apt-get), so not installing them."
    say "      Install with: sudo apt-get install ${missing[*]}"
    say "      Without bubblewrap the sandbox is NOT isolated; without ripgrep Grep uses grep; without g++ cpp/cuda builds fail."
  fi
}

# ----------------------------------------------------------------------------- 2. Python 3.12
is_python312() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; }

find_python312() {
  local candidates=() root
  [ -n "${PYTHON:-}" ] && candidates+=("$PYTHON")
  command -v python3.12 >/dev/null 2>&1 && candidates+=("$(command -v python3.12)")
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  # newest 3.12.x first
  while IFS= read -r p; do candidates+=("$p"); done < <(ls -d "$root"/versions/3.12*/bin/python3.12 2>/dev/null | sort -V -r)
  candidates+=(/usr/bin/python3.12 /usr/local/bin/python3.12)
  for p in "${candidates[@]}"; do
    if [ -x "$p" ] && is_python312 "$p"; then
      "$p" -c 'import sys; print(sys.executable)'
      return 0
    fi
  done
  die "kernel_env needs Python 3.12 and found none (looked at: \$PYTHON, python3.12 on PATH, $root/versions/3.12*, /usr/bin/python3.12).
       Install one (pyenv install 3.12, or apt-get install python3.12 python3.12-venv) or point PYTHON at it: make PYTHON=/path/to/python3.12 test"
}

# dist_version PYTHON NAME: the installed version of a distribution, or nothing (reads metadata: no slow import)
dist_version() {
  "$1" -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass' "$2" 2>/dev/null || true
}
torch_version() { dist_version "$1" torch; }

at_least() {  # at_least VERSION MINIMUM, comparing major.minor (2.14.1+cu130 >= 2.11)
  awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, "."); split(b, y, "."); exit !(x[1] * 1000 + x[2] >= y[1] * 1000 + y[2]) }'
}

# ----------------------------------------------------------------------------- main
system_tools

PY312=$(find_python312)
known=$("$PY312" -c 'import tomllib
print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"])')
for extra in "$@"; do  # pip would only warn about an extra pyproject.toml lacks
  [[ " $known " == *" $extra "* ]] || die "pyproject.toml has no extra '$extra' (it has: $known)"
done

# The stamp: this key on its first line, the extras installed on its second.
KEY="$(sha256sum pyproject.toml | cut -d' ' -f1) $PY312 $TORCH_SPEC"
stamp_key='' stamp_extras=''
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ]; then
  stamp_key=$(sed -n 1p "$STAMP") stamp_extras=$(sed -n 2p "$STAMP")
fi
missing=()
for extra in "$@"; do [[ " $stamp_extras " == *" $extra "* ]] || missing+=("$extra"); done
if [ "$stamp_key" = "$KEY" ] && [ ${#missing[@]} -eq 0 ]; then
  extras=${stamp_extras:+, extras: $stamp_extras}
  say "set-up is up to date ($VENV, $("$VENV/bin/python" --version), torch $(torch_version "$VENV/bin/python")$extras)"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ] || ! is_python312 "$VENV/bin/python"; then
  rm -rf "$VENV"
  stamp_extras=''
  base_torch=$(torch_version "$PY312")
  if [ -n "$base_torch" ] && at_least "$base_torch" "$TORCH_MIN"; then
    say "creating $VENV from $PY312 with its site-packages (it has torch $base_torch, which is kept)"
    "$PY312" -m venv --system-site-packages "$VENV" || die "could not create $VENV (on Debian: apt-get install python3.12-venv)"
  else
    say "creating $VENV from $PY312"
    "$PY312" -m venv "$VENV" || die "could not create $VENV (on Debian: apt-get install python3.12-venv)"
  fi
fi
PY="$VENV/bin/python"

have_torch=$(torch_version "$PY")
if [ -n "$have_torch" ] && at_least "$have_torch" "$TORCH_MIN"; then
  say "torch $have_torch is already installed; keeping it"
else
  say "installing $TORCH_SPEC${have_torch:+ (found torch $have_torch, older than $TORCH_MIN)}: a large download (with its CUDA libraries, gigabytes), minutes on a usual connection"
  read -ra torch_args <<< "$TORCH_SPEC"  # pip's arguments: a requirement, and an --index-url say
  pip_install "${torch_args[@]}"
fi

# The extras asked for and those the venv has (a changed pyproject.toml may have changed their pins).
extras=$(printf '%s\n' $stamp_extras "$@" | sort -u | xargs)
# kernel_env's editable wheel is built with the venv's setuptools when that one can (torch brings it on
# Python 3.12): pyproject.toml's build-system asks for setuptools>=69 and wheel, and setuptools >= 70.1
# builds wheels itself. Else pip builds in an isolated environment it installs first (about 5 s more here).
isolation=()
setuptools=$(dist_version "$PY" setuptools)
[ -n "$setuptools" ] && at_least "$setuptools" 70.1 && isolation=(--no-build-isolation)
if [ -n "$extras" ]; then
  say "installing kernel_env (editable) with the extras: $extras"
  pip_install "${isolation[@]}" -e ".[${extras// /,}]"
else
  say "installing kernel_env (editable) with its base dependencies (make test adds the test extras)"
  pip_install "${isolation[@]}" -e .
fi
"$VENV/bin/kernel-env" --version >/dev/null || die "kernel-env does not start after the install"
printf '%s\n%s\n' "$KEY" "$extras" > "$STAMP"
say "done: $VENV ($("$PY" --version), torch $(torch_version "$PY")${extras:+, extras: $extras})"
