"""Causes, not symptoms: the missing durability step behind a failing crash image.

A failing image says where a crash landed. The cause is the persistence
assumption that broke (ALICE's "vulnerability"): which unsynced operation the
program relied on. For a failing image at one crash point this module

1. rebuilds the disk with *every* unsynced operation kept; if even that fails,
   the state itself is the problem (an update that is not atomic, or data a
   failed fsync dropped for good);
2. for a torn image, rebuilds it with the torn write simply missing; if that
   passes, the tear is the cause (recovery does not handle a torn write);
3. otherwise loses the operations the failing image lost, one at a time
   (then a 1-minimal set when no single one suffices), and names each whose
   loss alone breaks the check, with what made it matter: a later rename that
   published the file, a later acknowledgement, an earlier truncate.

Every rebuilt disk obeys the profile (a journal loses a suffix of namespace
changes; auto_da_alloc keeps a replaced file's data with its rename). Checks
are cached by image content, so the analysis costs at most one check per
unsynced operation per crash point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from faultfs._images import ImageChoice, durable_image, process_image
from faultfs._model import TRUNCATE, Model, apply_data_ops
from faultfs._trace import Frame, Op

# Operations that destroy an old copy of data (what a new copy must precede).
DESTRUCTIVE_KINDS = frozenset(("truncate", "unlink", "rmdir"))
# Operations that advance the model's clock (their seq names them uniquely).
CLOCKED_KINDS = frozenset(
    ("create", "write", "truncate", "rename", "unlink", "mkdir", "rmdir", "link")
)


class Outcome(NamedTuple):
    """Why a check failed: the exception text, its traceback and the user frame that raised."""

    error: str
    traceback: str
    frame: Frame | None


Verdict = Callable[[Model], "Outcome | None"]


class Step(NamedTuple):
    """One operation (or acknowledgement) a cause is made of."""

    role: str  # "write", "rename", "create", "acknowledged", "failed fsync", ...
    kind: str  # the operation's kind ("ack" for an acknowledgement)
    path: str
    args: tuple[object, ...]
    frames: tuple[Frame, ...]

    @property
    def site(self) -> str:
        for frame in self.frames:
            if not frame.in_stdlib:
                return str(frame)
        return str(self.frames[0]) if self.frames else "<unknown>"


def _step(role: str, op: Op) -> Step:
    return Step(role, op.kind, op.path, op.args, op.stack)


def _ack_step(frames: tuple[Frame, ...]) -> Step:
    return Step("acknowledged", "ack", "", (), frames)


class Finding(NamedTuple):
    """One cause found on one failing image; explore merges findings by ``key``."""

    kind: str
    key: tuple[object, ...]
    steps: tuple[Step, ...]
    note: str  # torn shape, errno, the check's error: what the summary quotes


# ------------------------------------------------------------------- units


def _anchored(finding: Finding) -> bool:
    """Whether a finding says why the program relied on the lost operation.

    A plain loss (no later rename, acknowledgement or truncate involved) has
    no reason of its own: in a set of operations lost together it yields to a
    member that has one.
    """
    if finding.kind == "lost-truncate":
        return False
    if finding.kind in ("entry-not-durable", "unsynced-data"):
        return any(s.role in ("acknowledged", "then") for s in finding.steps)
    return True


class Unit(NamedTuple):
    """One unsynced operation at the crash point."""

    meta: bool
    ident: int  # index into Model.meta_pending, or the data op's gseq
    gseq: int
    ino: int  # the data op's inode (0 for namespace changes)


class CrashPoint:
    """Everything needed to analyse the failing images of one crash point."""

    def __init__(
        self,
        model: Model,
        trace: Iterable[Op],
        op_inodes: dict[int, int],
        ack_marks: list[tuple[int, tuple[Frame, ...]]],
        verdict: Verdict,
        ack_buffered: list[tuple[int, tuple[str, ...]]] | None = None,
    ) -> None:
        self.model = model
        self.trace = list(trace)
        self.op_inodes = op_inodes
        self.ack_marks = ack_marks
        self.ack_buffered = ack_buffered or []
        self.verdict = verdict
        self.by_seq = {op.seq: op for op in self.trace if op.kind in CLOCKED_KINDS}
        units = [Unit(True, i, m.gseq, 0) for i, m in enumerate(model.meta_pending)]
        for node in model.inodes.values():
            if not node.is_dir:
                units += [Unit(False, op[0], op[0], node.ino) for op in node.pending]
        self.units = sorted(units, key=lambda u: u.gseq)
        self._full_ok: bool | None = None
        self._alone: dict[Unit, bool] = {}

    # ----------------------------------------------------------- rebuilding

    def without(self, lost: Iterable[Unit]) -> Model:
        """The disk with every unsynced operation but ``lost`` kept (closed per profile)."""
        lost = set(lost)
        meta = [u.ident for u in self.units if u.meta and u not in lost]
        if self.model.profile.meta_journal:
            first_lost = min((u.ident for u in lost if u.meta), default=None)
            if first_lost is not None:
                meta = [i for i in meta if i < first_lost]  # a journal loses a suffix
        data = [u.ident for u in self.units if not u.meta and u not in lost]
        return durable_image(self.model, ImageChoice(meta=frozenset(meta), data=frozenset(data)))

    def fails(self, lost: Iterable[Unit]) -> bool:
        return self.verdict(self.without(lost)) is not None

    def _fails_alone(self, unit: Unit) -> bool:
        known = self._alone.get(unit)
        if known is None:
            known = self._alone[unit] = self.fails((unit,))
        return known

    # ------------------------------------------------------------- analysis

    def analyze(self, choice: ImageChoice | None, outcome: Outcome) -> list[Finding]:
        """The causes behind one failing image of this crash point."""
        if self._full_ok is None:
            self._full_ok = not self.fails(())
        if not self._full_ok:
            return self._state_itself(outcome)
        if choice is None or choice.everything:
            return self._state_itself(outcome)  # the page cache kept everything
        if choice.torn is not None:
            torn_ino = choice.tear[0] if choice.tear is not None else 0
            landed = {
                u for u in self.units if not u.meta and u.ino == torn_ino and u.gseq < choice.torn
            }
            if not self.fails(u for u in self.units if u not in landed):
                return [self._torn(choice, outcome)]
            lost0 = [u for u in self.units if u not in landed]
        else:
            kept = self._kept(choice)
            lost0 = [u for u in self.units if u not in kept]
        singles = self._latest_in_journal([u for u in lost0 if self._fails_alone(u)])
        if singles:
            return _merge_same_key([self._lost(u) for u in singles])
        return self._lost_together(lost0, outcome)

    def _latest_in_journal(self, singles: list[Unit]) -> list[Unit]:
        """Of namespace changes whose loss alone fails, the latest, when a journal orders them.

        A journal loses a suffix: losing an earlier change loses every later
        one with it, so when the latest already fails alone the earlier ones
        are not losses of their own (a temporary file's create and the rename
        that publishes it are one missing directory fsync, not two).
        """
        if not self.model.profile.meta_journal:
            return singles
        meta = [u for u in singles if u.meta]
        if len(meta) < 2:
            return singles
        latest = max(meta, key=lambda u: u.ident)
        return [u for u in singles if not u.meta or u is latest]

    def _kept(self, choice: ImageChoice) -> set[Unit]:
        kept_data = set(choice.data)
        for index in choice.meta:
            flush = self.model.meta_pending[index].flush
            if flush is not None:
                ino, upto = flush
                kept_data.update(u.ident for u in self.units if u.ino == ino and u.gseq <= upto)
        return {
            u
            for u in self.units
            if (u.meta and u.ident in choice.meta) or (not u.meta and u.ident in kept_data)
        }

    def _lost_together(self, lost0: list[Unit], outcome: Outcome) -> list[Finding]:
        if not lost0 or not self.fails(lost0):
            # The profile's closure kept something the image lost (or nothing
            # was lost): the failure is not explained by losing operations.
            return self._state_itself(outcome)
        needed = list(lost0)
        for unit in list(needed):
            trial = [u for u in needed if u is not unit]
            if trial and self.fails(trial):
                needed = trial
        findings = [self._lost(u) for u in needed]
        # A member whose loss the program relied on (a later rename published
        # it, an acknowledgement promised it, a truncate preceded it) is the
        # cause; the others only had to be lost too for the damage to show
        # (a later rename that would have hidden it, say).
        anchored = [f for f in findings if _anchored(f)]
        if anchored:
            return _merge_same_key(anchored)
        steps = tuple(_step(self._role(u), op) for u in needed if (op := self._op(u)) is not None)
        key = ("lost-together", tuple(sorted((s.kind, s.site) for s in steps)))
        return [Finding("lost-together", key, steps, "")]

    # -------------------------------------------------------------- causes

    def _op(self, unit: Unit) -> Op | None:
        return self.by_seq.get(unit.gseq)

    def _role(self, unit: Unit) -> str:
        if unit.meta:
            return self.model.meta_pending[unit.ident].kind
        op = self._op(unit)
        return op.kind if op is not None else "write"

    def _ack_after(self, clock: int) -> tuple[Frame, ...] | None:
        for mark_clock, frames in self.ack_marks:
            if mark_clock >= clock:
                return frames
        return None

    def _lost(self, unit: Unit) -> Finding:
        op = self._op(unit)
        if op is None:  # untraced (record_trace=False): name the kind only
            op = Op(self._role(unit), "?", (), "<untraced>")
        if unit.meta:
            entry: tuple[Step, ...] = (_step(op.kind, op),)
            ack = self._ack_after(unit.gseq)
            later = self._destroyed_after(unit.gseq, op.path) if ack is None else None
            if ack is not None:
                entry += (_ack_step(ack),)
            elif later is not None:
                entry += (_step("then", later),)
            entry_key = ("entry-not-durable", op.kind, op.site, _anchor(entry))
            return Finding("entry-not-durable", entry_key, entry, "")
        node = self.model.inodes[unit.ino]
        if op.kind == "truncate":
            return Finding(
                "lost-truncate", ("lost-truncate", op.site), (_step("truncate", op),), ""
            )
        for gseq, kind, _size, _payload in node.pending:
            if kind == TRUNCATE and gseq < unit.gseq and self._cuts_data(gseq):
                truncate = self.by_seq.get(gseq)
                if truncate is not None:
                    steps = (_step("truncate", truncate), _step("write", op))
                    return Finding(
                        "in-place-rewrite", ("in-place-rewrite", truncate.site), steps, ""
                    )
        publisher = self._published_by(unit)
        if publisher is not None:
            steps = (_step("write", op), _step(publisher.kind, publisher))
            return Finding(
                "unsynced-before-rename", ("unsynced-before-rename", publisher.site), steps, ""
            )
        ack = self._ack_after(unit.gseq)
        if ack is not None:
            steps = (_step("write", op), _ack_step(ack))
            key = ("unsynced-before-ack", _site(ack))
            return Finding("unsynced-before-ack", key, steps, "")
        lost: tuple[Step, ...] = (_step("write", op),)
        later = self._destroyed_after(unit.gseq, op.path)
        if later is not None:
            lost += (_step("then", later),)
        return Finding("unsynced-data", ("unsynced-data", op.site, _anchor(lost)), lost, "")

    def _cuts_data(self, gseq: int) -> bool:
        """Whether the truncate at ``gseq`` cut bytes the file held (an in-place rewrite).

        ``open(name, "w")`` of the empty file ``mkstemp`` just made truncates
        nothing: the file is a new copy, and losing its data is a missing
        fsync before whatever relied on it, not a rewrite in place. A truncate
        already flushed is not in the pending list; it counts as cutting.
        """
        for node in self.model.inodes.values():
            if node.is_dir:
                continue
            for index, (seq, kind, size, _payload) in enumerate(node.pending):
                if seq == gseq and kind == TRUNCATE:
                    return len(apply_data_ops(node.durable, node.pending[:index])) > size
        return True

    def _destroyed_after(self, gseq: int, path: str) -> Op | None:
        """The first later truncate, unlink or rmdir of another file: what made a loss matter.

        ALICE's ordering vulnerabilities: a new copy must be durable before
        the old one is destroyed. Every operation after the lost one is kept
        when a single loss is tried, so the first such op is the one relied on.
        """
        for op in self.trace:
            destroys = op.kind != "truncate" or self._cuts_data(op.seq)
            if op.seq > gseq and op.kind in DESTRUCTIVE_KINDS and op.path != path and destroys:
                return op
        return None

    def _published_by(self, unit: Unit) -> Op | None:
        """The first rename or link after ``unit`` that gave its file a new name."""
        for op in self.trace:
            published = op.kind in ("rename", "link") and op.seq > unit.gseq
            if published and self.op_inodes.get(op.seq) == unit.ino:
                return op
        return None

    def _torn(self, choice: ImageChoice, outcome: Outcome) -> Finding:
        assert choice.torn is not None
        op = self.by_seq.get(choice.torn) or Op("write", "?", (), "<untraced>")
        steps = [_step("write", op)]
        if outcome.frame is not None:
            steps.append(Step("recovery", "check", "", (), (outcome.frame,)))
        shape = choice.detail.rsplit("torn: ", 1)[-1]
        return Finding("torn-write", ("torn-write", op.site), tuple(steps), shape)

    def _state_itself(self, outcome: Outcome) -> list[Finding]:
        if self.model.dropped and self.verdict(process_image(self.model)) is None:
            return [self._dropped(entry) for entry in self.model.dropped]
        buffered = self._buffered_at_ack()
        if buffered:
            return buffered
        # The state between two operations is the problem. Crashing after one
        # operation and before the next leave the same state: name it by the
        # last operation that completed.
        done = [
            op
            for op in self.trace
            if op.kind in CLOCKED_KINDS and (op.kind != "truncate" or self._cuts_data(op.seq))
        ]
        if not done:
            return [Finding("not-atomic", ("not-atomic", "<start>"), (), outcome.error)]
        last = done[-1]
        if last.kind == "truncate":
            steps = (_step("truncate", last),)
            return [Finding("in-place-rewrite", ("in-place-rewrite", last.site), steps, "")]
        step = _step("after", last)
        return [Finding("not-atomic", ("not-atomic", last.site), (step,), outcome.error)]

    def _buffered_at_ack(self) -> list[Finding]:
        """The acknowledgements made while a Python file object still held data that it
        never wrote to the OS before the crash: the state the OS had cannot hold what was
        acknowledged, and no durability step is to blame but the missing flush."""
        findings = []
        for index, paths in self.ack_buffered:
            clock, frames = self.ack_marks[index]
            for path in paths:
                if any(
                    op.kind == "write" and op.path == path and op.seq > clock for op in self.trace
                ):
                    continue  # the buffer reached the OS before the crash: not this
                held = ("in a file object's buffer",)
                step = Step("still buffered", "unflushed", path, held, frames)
                key = ("buffered-ack", _site(frames), path)
                findings.append(Finding("buffered-ack", key, (step, _ack_step(frames)), ""))
        return findings

    def _dropped(self, entry: tuple[int, int, tuple[tuple[int, int, int, bytes], ...]]) -> Finding:
        ino, clock, ops = entry
        seqs = {op[0] for op in ops}
        steps = [_step("write", op) for op in self.trace if op.seq in seqs and op.kind == "write"]
        failed = next(
            (
                op
                for op in self.trace
                if op.kind in ("fsync", "fdatasync")
                and op.seq == clock
                and op.args
                and str(op.args[0]).startswith("failed")
            ),
            None,
        )
        note = ""
        if failed is not None:
            steps.append(_step("failed fsync", failed))
            note = str(failed.args[0]).removeprefix("failed: ")
            after = self.trace[self.trace.index(failed) + 1 :]
            retry = next(
                (
                    op
                    for op in after
                    if op.kind in ("fsync", "fdatasync")
                    and op.path == failed.path
                    and not (op.args and str(op.args[0]).startswith("failed"))
                ),
                None,
            )
            if retry is not None:
                steps.append(_step("retried fsync", retry))
        ack = self._ack_after(clock)
        if ack is not None:
            steps.append(_ack_step(ack))
        key = ("fsync-error", failed.site if failed is not None else str(ino))
        return Finding("fsync-error", key, tuple(steps), note)


def _anchor(steps: tuple[Step, ...]) -> str:
    """What made a loss matter, for a cause's key: a cause that says "before it was
    acknowledged" must not gather images where nothing was acknowledged yet."""
    roles = {s.role for s in steps}
    return "acknowledged" if "acknowledged" in roles else "then" if "then" in roles else ""


STEP_ORDER = (
    "truncate",
    "still buffered",
    "write",
    "failed fsync",
    "retried fsync",
    "recovery",
    "then",
    "acknowledged",
)
"""The order a cause's steps read in: what was done, then what relied on it."""


def step_order(step: Step) -> int:
    return STEP_ORDER.index(step.role) if step.role in STEP_ORDER else 1


def merge_steps(known: tuple[Step, ...], more: tuple[Step, ...]) -> tuple[Step, ...]:
    """``known`` and the steps of ``more`` it lacks, in reading order.

    A helper that writes several files, or makes several directories, is one
    site but several steps to name: steps differ by role, site and path.
    """
    have = {(s.role, s.site, s.path) for s in known}
    extra = tuple(s for s in more if (s.role, s.site, s.path) not in have)
    return tuple(sorted(known + extra, key=step_order)) if extra else known


def _merge_same_key(findings: list[Finding]) -> list[Finding]:
    out: dict[tuple[object, ...], Finding] = {}
    for finding in findings:
        known = out.get(finding.key)
        if known is None:
            out[finding.key] = finding
        else:
            out[finding.key] = known._replace(steps=merge_steps(known.steps, finding.steps))
    return list(out.values())


def _site(frames: tuple[Frame, ...]) -> str:
    for frame in frames:
        if not frame.in_stdlib:
            return str(frame)
    return str(frames[0]) if frames else "<unknown>"
