# free_port (sourced by lib.sh and torch_lib.sh, after python.sh): a TCP port free now, from 20000-28999: below the kernel's
# ephemeral range, and above the fixed ports the test clusters and controllers use (16817-18999). An ephemeral port
# that was free when probed could be taken by another test's outgoing connection before the test bound it
# (EADDRINUSE seen under ctest -j3).
free_port() {
  "$PY" -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(500):
    port = random.randrange(20000, max(20001, min(29000, low)))
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            continue
    print(port)
    break
else:
    raise SystemExit("free_port: no free port below the ephemeral range")'
}
