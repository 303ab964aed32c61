# Sourced by scripts/aria2p.sh, scripts/conformance.sh and bench/rpc.sh: the one virtual environment of the aria2
# clients from PyPI (aria2p, which brings websocket-client; aioaria2), made or completed under .build/.
# aria2_venv ROOT: sets $venv.
aria2_venv() {
    venv=$1/.build/aria2p-venv
    [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
    "$venv/bin/python" -c "import aria2p" 2>/dev/null \
        || "$venv/bin/pip" install -q --disable-pip-version-check "aria2p==0.12.3"
    "$venv/bin/python" -c "import aioaria2" 2>/dev/null \
        || "$venv/bin/pip" install -q --disable-pip-version-check "aioaria2==1.3.7"
}
