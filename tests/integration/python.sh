# The Python every test and benchmark script runs (sourced): Debian's, which python3-torch serves; CKPT_PYTHON
# overrides it. Never the first python3 on PATH: a version manager's shim there (pyenv's) lacks torch, and each call
# through it cost 0.6 s of CPU and 240 processes on the 2-core CI host, in helpers that poll.
PY=${CKPT_PYTHON:-/usr/bin/python3}
