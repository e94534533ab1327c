#!/bin/sh
# Installs what kiln's build and tests need on a Debian/Ubuntu machine:
#   Debian packages: gcc make xxd libcjson-dev libpcre2-dev libutf8proc-dev
#                    libmicrohttpd-dev (clang for `make fuzz`, optional)
#   PyPI (tests/server): pytest openai
# As root it installs what is missing; otherwise it names what is missing and
# stops. It never touches anything already present.
set -e

pkgs="gcc make xxd libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev python3 python3-pip"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# python3/pip may come from elsewhere (pyenv): accept a working one
if command -v python3 >/dev/null 2>&1; then
    missing=$(echo "$missing" | sed 's/ python3-pip//; s/ python3\b//')
    python3 -m pip --version >/dev/null 2>&1 || missing="$missing python3-pip"
fi
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing Debian packages:$missing"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    else
        echo "setup: missing Debian packages:$missing" >&2
        echo "setup: install them with: sudo apt-get install$missing" >&2
        exit 1
    fi
fi

pymissing=""
python3 -c "import pytest" 2>/dev/null || pymissing="$pymissing pytest"
python3 -c "import openai" 2>/dev/null || pymissing="$pymissing openai"
if [ -n "$pymissing" ]; then
    echo "setup: installing PyPI packages:$pymissing"
    python3 -m pip install -q $pymissing 2>/dev/null || python3 -m pip install -q --break-system-packages $pymissing || {
        echo "setup: could not install$pymissing with pip; install them and run again" >&2
        exit 1
    }
fi
echo "setup: ok"
