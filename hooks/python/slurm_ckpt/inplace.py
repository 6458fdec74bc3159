"""Who trains as which rank, generation by generation, when a job recovers in place (no torch here).

`ckpt-run --spares N` starts one step per node: the training nodes' processes (CKPT_INPLACE_RANK_BASE + their
SLURM_PROCID is their rank) and the spares' (CKPT_INPLACE_SPARE=1), which wait, framework imported, to take a dead
rank over. They meet in one directory of the checkpoint dir's control area, `.control/inplace-<CKPT_INPLACE_ID>/`,
whose records (spares, claims, plans, phases, mailboxes, the secret, the markers) are written and read by the
native code only (_native.inplace, ckpt/inplace.hpp lists them): a torn or foreign record reads as absent.

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

from . import _native

_core = _native.inplace
ENV = _native.env_names()  # setting key -> variable (ckpt/env_contract.hpp)

EXIT_PEER_LOST = _core.EXIT_PEER_LOST  # a survivor that cannot go on: the requeue path takes over


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


_address = None


def address():
    """The address this process publishes to its peers and binds: the native rule (CKPT_ADDR, CKPT_IFNAME /
    GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, never a host name on loopback), worked out once per process; its
    warning, if any, is printed once."""
    global _address
    if _address is None:
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


def seal(secret, label, body):
    """`body` (text: a record's JSON) as text that unseal() accepts only with the same secret and label."""
    mac = hmac.new(secret, f"seal:{label}\n{body}".encode(), hashlib.sha256).hexdigest()
    return json.dumps({"body": body, "mac": mac})


def unseal(secret, label, text):
    """The body seal() sealed, or None when `text` was not sealed with this secret and label."""
    try:
        sealed = parse_bounded(text)
        body, mac = sealed["body"], sealed["mac"]
        expected = hmac.new(secret, f"seal:{label}\n{body}".encode(), hashlib.sha256).hexdigest()
        if not (isinstance(body, str) and isinstance(mac, str) and hmac.compare_digest(mac, expected)):
            return None
        return body
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

    def record(self):
        """The address as the spare's record holds it."""
        box = _core.SpareMailbox()
        box.addr, box.port, box.token = self.address["addr"], self.address["port"], self.token
        return box

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
    """Hands `message` to the spare whose mailbox is `address` ({addr, port, token}, or its record's
    SpareMailbox); False when it cannot be reached (the spare then finds its claim file)."""
    if isinstance(address, _core.SpareMailbox):
        address = {"addr": address.addr, "port": address.port, "token": address.token}
    try:
        with socket.create_connection((address["addr"], address["port"]), timeout=timeout_s) as conn:
            conn.sendall(json.dumps(dict(message, token=address["token"])).encode() + b"\n")
        return True
    except (OSError, KeyError, TypeError):
        return False


def refuses(addr, port, timeout_s=0.5):
    """Whether a connection to addr:port is refused: nothing listens there any more. A mailbox's listener lives as
    long as its process, so a refusal says the process is gone; a live one accepts, and one behind a cut link
    times out (not a refusal)."""
    return _native.refuses(addr, port, timeout_s)


def claim_of(message):
    """(claim, plan or None) from a claim message ({generation, rank, plan: the plan's JSON}); None when the
    message is no claim."""
    if not isinstance(message, dict):
        return None
    claim = _core.Claim.parse(json.dumps({"generation": message.get("generation"), "rank": message.get("rank")}))
    if claim is None:
        return None
    plan = message.get("plan")
    plan = _core.Plan.parse(plan) if isinstance(plan, str) else None
    return claim, (plan if plan is not None and plan.generation == claim.generation else None)


def notify_launcher(env=os.environ):
    """Tells ckpt-run to read the records now (CKPT_INPLACE_NOTIFY, "<addr>:<port>"): a connection that carries
    nothing, tried once for a second at most. Without it ckpt-run reads them every 2 s."""
    host, _, port = env.get(ENV["inplace_notify"], "").rpartition(":")
    if not host or not port.isdigit():
        return False
    try:
        socket.create_connection((host, int(port)), timeout=1.0).close()
        return True
    except OSError:
        return False


class Launch:
    """What the launcher told this process (None when it was not started for in-place recovery)."""

    def __init__(self, env):
        self.id = env[ENV["inplace_id"]]
        self.world = int(env[ENV["inplace_world"]])
        self.spare = env.get(ENV["inplace_spare"]) == "1"
        self.local = int(env.get("SLURM_LOCALID", "0"))
        self.node = env.get("SLURMD_NODENAME") or socket.gethostname()
        self.rank = None if self.spare else int(env[ENV["inplace_rank_base"]]) + int(env.get("SLURM_PROCID", "0"))
        # After ckpt-run relaunched the node steps, generations count on from the abandoned launch's: the
        # checkpoint dir's epoch record fences by generation, and the relaunch must be the newer run.
        self.generation_base = int(env.get(ENV["inplace_generation_base"], "0"))
        root = env.get(ENV["dir"])
        if not root:
            raise RuntimeError(f"ckpt: in-place recovery needs a checkpoint dir ({ENV['dir']})")
        if not all(c.isalnum() or c in "._-" for c in self.id) or self.id.startswith("."):
            raise RuntimeError(f"ckpt: {ENV['inplace_id']}='{self.id}': expected letters, digits, '.', '_' or '-'")
        self.dir = _core.records_dir(root, self.id)
        self.shrink = env.get(ENV["shrink"], "off")  # whether a recovery without spares goes on with fewer ranks
        try:
            _core.check_shrink(self.shrink)
        except ValueError as e:
            raise RuntimeError(str(e)) from None

    @staticmethod
    def from_env(env=os.environ):
        return Launch(env) if env.get(ENV["inplace_id"]) else None

    @property
    def slot(self):
        return f"{self.node}.{self.local}"


class Membership:
    """This process's view of the run's records (see the module's doc), and the waits on them."""

    def __init__(self, launch, poll_s=0.005, slow_poll_s=1.0):
        self.launch = launch
        self.dir = launch.dir
        self.poll_s = poll_s  # the first interval of a back-off
        self.slow_poll_s = slow_poll_s  # a file fallback's interval, and the back-off's longest
        self.records = _core.Records(launch.dir)

    def secret(self):
        """The job's secret: read, or made whole by the first process that needs it."""
        return self.records.secret()

    # ---- spares --------------------------------------------------------------------------------------------------

    def register_spare(self, mailbox=None):
        spare = _core.Spare()
        spare.node, spare.local, spare.pid, spare.ready_unix = self.launch.node, self.launch.local, os.getpid(), time.time()
        if mailbox is not None:
            spare.mailbox = mailbox.record()
        self.records.write_spare(spare)

    def finished(self):
        """Whether rank 0 marked training finished (its train() returned)."""
        return self.records.marked("finished")

    def ended(self):
        """Whether training ended (`finished`) or was handed over (`abandoned`)."""
        return self.finished() or self.records.marked("abandoned")

    def wait_claim(self, mailbox=None):
        """A spare waits here: (its claim, the plan when it came through `mailbox`), or None when training ended
        without it. Between waits of slow_poll_s in the mailbox: the claim file (in case the root could not reach
        the mailbox) and the markers."""
        slot = self.launch.slot
        while True:
            if mailbox is not None:
                message = mailbox.receive(self.slow_poll_s)
                got = claim_of(message) if message is not None else None
                if got is not None:
                    return got
            else:
                time.sleep(self.slow_poll_s)
            claim = self.records.read_claim(slot)
            if claim is not None:
                return claim, None
            if self.ended():
                return None

    def deliver_claims(self, plan, claims):
        """At the root, after write_plan: hands each claimed spare its claim and the plan through its mailbox (one
        read of its record, one connection). Returns the slots it could not reach: they find their claim file."""
        missed = []
        text = plan.to_json()
        for slot, rank in claims:
            spare = self.records.read_spare(slot)
            message = {"generation": plan.generation, "rank": rank, "plan": text}
            if spare is None or spare.mailbox is None or not send_to_spare(spare.mailbox, message):
                missed.append(slot)
        return missed

    def free_spares(self):
        """Ready spares no plan claimed, sorted."""
        return self.records.free_spares()

    # ---- plans ---------------------------------------------------------------------------------------------------

    def write_plan(self, plan, claims=()):
        """Writes the claims, then the plan (stamped with the time); returns the plan as written."""
        return self.records.write_plan(plan, list(claims))

    def has_plan(self, generation):
        return self.records.has_plan(generation)

    def wait_plan(self, generation, timeout_s, slow=False):
        """The plan of `generation` once its record exists, or None after timeout_s. Polls backing off from
        poll_s to slow_poll_s; with `slow`, at slow_poll_s from the start (a fallback)."""
        deadline = time.monotonic() + timeout_s
        for delay in backoff(self.slow_poll_s if slow else self.poll_s, self.slow_poll_s):
            plan = self.records.read_plan(generation)
            if plan is not None:
                return plan
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(delay, left))

    # ---- the ranks' mailbox stores -------------------------------------------------------------------------------

    def publish_mailbox(self, rank, generation, addr, port):
        """mailbox-<rank>: where this process, as a recovery's root, posts the plan."""
        box = _core.Mailbox()
        box.rank, box.generation, box.addr, box.port, box.pid = rank, generation, addr, port, os.getpid()
        self.records.publish_mailbox(box)

    def mailbox(self, rank):
        """The mailbox rank `rank` published, or None."""
        return self.records.read_mailbox(rank)

    def write_phases(self, phases):
        """gen-<G>.phases: when each phase of recovery G ended, written at its first step."""
        self.records.write_phases(phases)
        notify_launcher()

    def mark(self, name, why="", lost=(), alone=False):
        """`finished` or `abandoned`: tells the idle spares to leave. ckpt-run is told of `finished` (rank 0 alone
        writes it), and of `abandoned` where its writer is `alone` in giving up (a survivor stuck in a collective:
        the others wait for it to join); an `abandoned` every survivor writes at once it reads when a step ends and
        every 2 s, so that a hand-over costs it no connection per rank. `lost`: the ranks lost, whose nodes a
        relaunch leaves out."""
        self.records.mark(name, why, sorted(lost))
        if name == "finished" or alone:
            notify_launcher()
