"""Who trains as which rank, generation by generation, when a job recovers in place (no torch here).

`ckpt-run --spares N` starts one step per node: the training nodes' processes (CKPT_INPLACE_RANK_BASE + their
SLURM_PROCID is their rank) and the spares' (CKPT_INPLACE_SPARE=1), which wait, framework imported, to take a dead
rank over. They meet in one directory of the checkpoint dir's control area, `.control/inplace-<CKPT_INPLACE_ID>/`:

  spare-<node>.<local>   a spare, ready, and the address and token of its claim mailbox (written once, at its start)
  claim-<node>.<local>   that spare's rank and generation (written by the recovery's root before the plan)
  gen-<G>.plan           generation G: its world, the address of its rendezvous store, who replaced whom
  gen-<G>.phases         when each phase of recovery G ended, written once training completed a step again
  mailbox-<rank>         the address of the store where that rank, as a recovery's root, posts the plan (written
                         once per process, when it first formed a group)
  secret                 32 random bytes, mode 0600, made by the first process to start: the keys of the stores
                         below are derived from it and the plans posted there are signed with it
  finished | abandoned   training ended (idle spares leave with 0) or handed over to a requeue (they leave with 75)

Every file is written whole and renamed into place, so a reader sees all of it or nothing. Generation 0's plan is
written by rank 0; a later one by the rank that decided the last words (the root among the survivors), from what
they agreed: the dead ranks, and the terminal checkpoint every rank resumes from.

The files are the record; the news travels over TCP, so that nobody polls the shared file system on a hot path.
The root hands each claimed spare its claim and the plan through the spare's mailbox (SpareMailbox), and posts
the plan in its own mailbox store (restart.py), where the survivors wait for it. The file fallbacks poll slowly:
a spare looks for its claim file and the markers once a second, a survivor whose root's store cannot be reached
reads the plan file once a second, and generation 0's ranks look for rank 0's plan backing off from 5 ms to 1 s.

Those stores are torch's TCPStore, which anyone on the network can connect to. A stranger must neither steer nor
stall a recovery through them: every key the job uses there is named by an HMAC of the job's secret (key()), so a
stranger can neither read nor write one (a TCPStore cannot list its keys), and a plan carries an HMAC of its own
(seal()), so that a process listening on a dead root's port cannot hand out a plan either.
"""
import hashlib
import hmac
import json
import os
import secrets
import socket
import sys
import time

EXIT_PEER_LOST = 75  # a survivor that cannot go on: the requeue path takes over (the controller reads it so)


def _write_atomic(path, data, durable=True):
    """`durable=False`: renamed into place without fsyncs, for what matters only while its writer lives."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.rename(tmp, path)
    if not durable:
        return
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_MESSAGE_MAX = 1 << 20  # a claim with its plan, or a plan file: a few hundred bytes per lost rank
_DEPTH_MAX = 16  # the deepest message the job sends (a plan inside a claim) nests 4 levels


def _nesting(text):
    """How deep the arrays and objects of JSON `text` nest (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def parse_bounded(data):
    """The JSON value of `data` (bytes or text), or None when it is not JSON, is over _MESSAGE_MAX bytes or nests
    deeper than _DEPTH_MAX: whatever a stranger sends, the parse neither recurses without bound nor raises."""
    if isinstance(data, bytes):
        if len(data) > _MESSAGE_MAX:
            return None
        try:
            data = data.decode()
        except UnicodeDecodeError:
            return None
    if not isinstance(data, str) or len(data) > _MESSAGE_MAX or _nesting(data) > _DEPTH_MAX:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _read_json(path):
    try:
        with open(path, "rb") as f:
            data = f.read(_MESSAGE_MAX + 1)
    except OSError:
        return None
    value = parse_bounded(data)
    return value if isinstance(value, dict) else None


_address = None


def address():
    """The address this process publishes to its peers and binds: the native rule (CKPT_ADDR, CKPT_IFNAME /
    GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, never a host name on loopback), worked out once per process; its
    warning, if any, is printed once."""
    global _address
    if _address is None:
        from . import _native
        addr, _how, warning = _native.publish_address()
        if warning:
            print(warning, file=sys.stderr, flush=True)
        _address = addr
    return _address


def backoff(first_s, max_s):
    """Poll intervals: first_s, doubling up to max_s, then max_s for ever."""
    delay = first_s
    while True:
        yield delay
        delay = min(delay * 2, max_s)


def key(secret, name):
    """The name under which the job keeps `name` in a TCPStore: unguessable without the job's secret."""
    return hmac.new(secret, f"key:{name}".encode(), hashlib.sha256).hexdigest()[:32]


def seal(secret, label, value):
    """`value` (JSON) as text that unseal() accepts only with the same secret and label."""
    body = json.dumps(value, sort_keys=True)
    mac = hmac.new(secret, f"seal:{label}\n{body}".encode(), hashlib.sha256).hexdigest()
    return json.dumps({"body": body, "mac": mac})


def unseal(secret, label, text):
    """What seal() sealed, or None when `text` was not sealed with this secret and label."""
    try:
        sealed = parse_bounded(text)
        body, mac = sealed["body"], sealed["mac"]
        expected = hmac.new(secret, f"seal:{label}\n{body}".encode(), hashlib.sha256).hexdigest()
        if not (isinstance(mac, str) and hmac.compare_digest(mac, expected)):
            return None
        return parse_bounded(body)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None



class SpareMailbox:
    """Where an idle spare is handed its claim: a listening socket of its own. The root connects once and sends one
    JSON line, {"token", "generation", "rank", "plan"}; the token (in the spare's file, in the private control dir)
    keeps stray connections from handing out ranks. The spare blocks in accept(), not on the file system."""

    def __init__(self, host):
        self.token = secrets.token_hex(16)
        self._sock = socket.create_server((host, 0), backlog=64)
        self.address = {"addr": host, "port": self._sock.getsockname()[1], "token": self.token}

    def receive(self, timeout_s):
        """The first message with this mailbox's token within timeout_s, without its token; None when none came."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._sock.settimeout(left)
            try:
                conn, _ = self._sock.accept()
            except OSError:  # timeout
                return None
            with conn:  # the root sends at once: a connection that says nothing holds the spare up briefly
                message = _read_line(conn, min(0.5, max(left, 0.1)))
            if isinstance(message, dict) and secrets.compare_digest(str(message.pop("token", "")).encode(),
                                                                    self.token.encode()):
                return message

    def close(self):
        self._sock.close()


def _read_line(conn, timeout_s):
    """One JSON value sent on `conn` (up to its newline or EOF) within timeout_s in all, or None: a sender that
    drips bytes, sends too many or nests too deep is dropped like one that sends nothing."""
    deadline = time.monotonic() + timeout_s
    data = b""
    try:
        while b"\n" not in data and len(data) <= _MESSAGE_MAX:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            conn.settimeout(left)
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        return None
    return parse_bounded(data.split(b"\n", 1)[0])


def send_to_spare(address, message, timeout_s=2.0):
    """Hands `message` to the spare whose mailbox is `address` (its spare file's); False when it cannot be reached
    (the spare then finds its claim file)."""
    try:
        with socket.create_connection((address["addr"], address["port"]), timeout=timeout_s) as conn:
            conn.sendall(json.dumps(dict(message, token=address["token"])).encode() + b"\n")
        return True
    except (OSError, KeyError, TypeError):
        return False


class Launch:
    """What the launcher told this process (None when it was not started for in-place recovery)."""

    def __init__(self, env):
        self.id = env["CKPT_INPLACE_ID"]
        self.world = int(env["CKPT_INPLACE_WORLD"])
        self.spare = env.get("CKPT_INPLACE_SPARE") == "1"
        self.local = int(env.get("SLURM_LOCALID", "0"))
        self.node = env.get("SLURMD_NODENAME") or socket.gethostname()
        self.rank = None if self.spare else int(env["CKPT_INPLACE_RANK_BASE"]) + int(env.get("SLURM_PROCID", "0"))
        root = env.get("CKPT_DIR")
        if not root:
            raise RuntimeError("ckpt: in-place recovery needs a checkpoint dir (CKPT_DIR)")
        if not all(c.isalnum() or c in "._-" for c in self.id) or self.id.startswith("."):
            raise RuntimeError(f"ckpt: CKPT_INPLACE_ID='{self.id}': expected letters, digits, '.', '_' or '-'")
        self.dir = os.path.join(root, ".control", f"inplace-{self.id}")

    @staticmethod
    def from_env(env=os.environ):
        return Launch(env) if env.get("CKPT_INPLACE_ID") else None

    @property
    def slot(self):
        return f"{self.node}.{self.local}"


class Membership:
    """The files of one in-place run (see the module's doc)."""

    def __init__(self, launch, poll_s=0.005, slow_poll_s=1.0):
        self.launch = launch
        self.dir = launch.dir
        self.poll_s = poll_s  # the first interval of a back-off
        self.slow_poll_s = slow_poll_s  # a file fallback's interval, and the back-off's longest
        os.makedirs(self.dir, mode=0o700, exist_ok=True)

    def _path(self, name):
        return os.path.join(self.dir, name)

    def secret(self):
        """The job's secret (see the module's doc): read, or made whole by the first process that needs it (a
        private file linked into place, so that a reader never sees part of it)."""
        path = self._path("secret")
        if not os.path.exists(path):
            tmp = self._path(f"secret.tmp.{os.getpid()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, secrets.token_bytes(32))
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:  # another process made it first: theirs is the job's
                pass
            finally:
                os.unlink(tmp)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            value = os.read(fd, 64)
        finally:
            os.close(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o077 or len(value) != 32:
            raise RuntimeError(f"ckpt: {path}: not this user's private 32-byte secret; refusing to use it")
        return value

    # ---- spares --------------------------------------------------------------------------------------------------

    def register_spare(self, mailbox=None):
        entry = {"node": self.launch.node, "local": self.launch.local, "pid": os.getpid(), "ready_unix": time.time()}
        if mailbox is not None:
            entry["mailbox"] = mailbox.address
        _write_atomic(self._path(f"spare-{self.launch.slot}"), json.dumps(entry))

    def wait_claim(self, mailbox=None):
        """A spare waits here: its claim ({generation, rank}, and the plan when it came through `mailbox`), or None
        when training ended without it. Between waits of slow_poll_s in the mailbox: the claim file (in case the
        root could not reach the mailbox) and the markers, three stats."""
        claim = self._path(f"claim-{self.launch.slot}")
        ended = (self._path("finished"), self._path("abandoned"))
        while True:
            if mailbox is not None:
                message = mailbox.receive(self.slow_poll_s)
                if message is not None:
                    return message
            else:
                time.sleep(self.slow_poll_s)
            value = _read_json(claim) if os.path.exists(claim) else None
            if value is not None:
                return value
            if any(os.path.exists(p) for p in ended):
                return None

    def deliver_claims(self, plan, claims):
        """At the root, after write_plan: hands each claimed spare its claim and the plan through its mailbox (one
        read of its spare file, one connection). Returns the slots it could not reach: they find their claim file."""
        missed = []
        for slot, rank in claims:
            entry = _read_json(self._path(f"spare-{slot}")) or {}
            message = {"generation": plan["generation"], "rank": rank, "plan": plan}
            if not send_to_spare(entry.get("mailbox"), message):
                missed.append(slot)
        return missed

    def free_spares(self):
        """Ready spares no plan claimed, in a stable order: whole nodes first."""
        names = sorted(os.listdir(self.dir))
        claimed = {n[len("claim-"):] for n in names if n.startswith("claim-")}
        slots = [n[len("spare-"):] for n in names if n.startswith("spare-") and ".tmp." not in n]
        return [s for s in slots if s not in claimed]

    # ---- plans ---------------------------------------------------------------------------------------------------

    def write_plan(self, generation, plan, claims=()):
        for slot, rank in claims:
            _write_atomic(self._path(f"claim-{slot}"), json.dumps({"generation": generation, "rank": rank}))
        plan = dict(plan, generation=generation, written_unix=time.time())
        _write_atomic(self._path(f"gen-{generation}.plan"), json.dumps(plan, sort_keys=True))
        return plan

    def has_plan(self, generation):
        return os.path.exists(self._path(f"gen-{generation}.plan"))

    def wait_plan(self, generation, timeout_s, slow=False):
        """The plan file of `generation` once it exists, or None after timeout_s. Polls backing off from poll_s to
        slow_poll_s; with `slow`, at slow_poll_s from the start (a fallback)."""
        path = self._path(f"gen-{generation}.plan")
        deadline = time.monotonic() + timeout_s
        for delay in backoff(self.slow_poll_s if slow else self.poll_s, self.slow_poll_s):
            if os.path.exists(path):
                plan = _read_json(path)
                if plan is not None:
                    return plan
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(delay, left))

    # ---- the ranks' mailbox stores -------------------------------------------------------------------------------

    def publish_mailbox(self, rank, generation, addr, port):
        """mailbox-<rank>: where this process, as a recovery's root, posts the plan. Needed only while it lives:
        no fsync."""
        _write_atomic(self._path(f"mailbox-{rank}"),
                      json.dumps({"rank": rank, "generation": generation, "addr": addr, "port": port,
                                  "pid": os.getpid()}), durable=False)

    def mailbox(self, rank):
        """The address rank `rank` published ({rank, generation, addr, port}), or None."""
        return _read_json(self._path(f"mailbox-{rank}"))

    def write_phases(self, generation, phases):
        """gen-<G>.phases: when each phase of recovery G ended (unix seconds), written at its first step."""
        _write_atomic(self._path(f"gen-{generation}.phases"), json.dumps(phases, sort_keys=True))

    def mark(self, name, why=""):
        """`finished` or `abandoned`: tells the idle spares to leave."""
        _write_atomic(self._path(name), json.dumps({"why": why, "unix": time.time()}))
