# The memory benchmarks' floor (sourced): memcpy_floor MIB prints the median seconds of 5 copies of MIB MiB between
# two torch tensors on this host, after one copy that faults both in.
memcpy_floor() {
  /usr/bin/python3 -c "
import time, torch
src = torch.ones($1 << 18); dst = torch.empty_like(src); dst.copy_(src)
t = []
for _ in range(5):
    t0 = time.perf_counter(); dst.copy_(src); t.append(time.perf_counter() - t0)
print(f'{sorted(t)[2]:.3f}')"
}
