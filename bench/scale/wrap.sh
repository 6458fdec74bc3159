#!/bin/sh
# Runs one task of bench/scale/run.sh: under strace when its rank is in BENCH_SCALE_TRACE (a comma list), so that
# the shared-file-system operations of a sample of ranks are counted. Only file and file-descriptor syscalls are
# traced, through a seccomp filter, so the heartbeat thread's send/recv/poll run at full speed.
case ",${BENCH_SCALE_TRACE:-}," in
  *",${SLURM_PROCID:-x},"*)
    fd_calls=read,write,pread64,pwrite64,readv,writev,fsync,fdatasync,syncfs,getdents64,ftruncate,fallocate,close
    exec strace -f --seccomp-bpf -ttt -y -o "${BENCH_SCALE_STRACE:?}/rank-$SLURM_PROCID" \
      -e trace="%file,%fstat,$fd_calls,lseek,flock,fchmod,fchown" "$@"
    ;;
esac
exec "$@"
