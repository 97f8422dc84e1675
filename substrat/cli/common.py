"""What every command shares: options, connecting, output, errors and exit codes.

Exit codes of every command (docs/daemon.md):

* 0: done;
* 1: the daemon refused the request (unknown agent, busy, ...), or fsck found damage;
* 2: usage error; no root there for a command that needs one; a directory that
  is not a root, or a root that cannot be used (see :mod:`substrat.rootdir`);
  or fsck could not run;
* 3: no daemon to talk to: not running (with ``--no-autostart``), failed to
  start, died mid-request, or silent past ``--timeout``;
* 141: standard output was closed by its reader (``| head -1``): the command
  stops quietly, as a program killed by SIGPIPE does (128 + 13).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import select
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from types import ModuleType
from typing import Any, NoReturn, TypeVar

import click
from click.core import ParameterSource

from substrat import client as client_mod
from substrat import rootdir
from substrat.cli.explain import reword
from substrat.cli.output import Output, escape, leave_quietly
from substrat.errors import (
    BadInputError,
    DaemonError,
    FsckError,
    RequestTimeoutError,
    RootError,
    RootLockedError,
    RootUnusableError,
    RpcError,
    SocketPathTooLongError,
    SubstratError,
)
from substrat.rootlinks import refuse_linked
from substrat.rootnest import settled
from substrat.rpc import protocol
from substrat.shellword import rooted, shell_word, shown, shown_in

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3

F = TypeVar("F", bound=Callable[..., Any])
PING_S = 5.0
"""How long a daemon silent during a turn has to answer a ping (:meth:`Opts.frozen_check`)."""


@dataclass
class Opts:
    """The common options of one invocation."""

    root: Path
    json: bool = False
    timeout_s: float = client_mod.DEFAULT_TIMEOUT_S
    autostart: bool = True
    creates_root: bool | None = False
    """True: the command may create the root; False: it needs one to exist;
    None: it picks its own root (``demo``)."""
    new_root: bool = False
    """The root does not exist yet (or is an empty directory): this command makes it."""
    _root_word: tuple[Path, str | None] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def check_root(self) -> None:
        """Refuse, before anything is written, a root path this command cannot use."""
        self.root = settled(self.root)  # `a/../x` printed, locked and made as the kernel reads it
        if self.creates_root is None:
            return
        if self.creates_root:
            state = rootdir.refuse_foreign(self.root).state
            self.new_root = state in (rootdir.RootState.MISSING, rootdir.RootState.EMPTY)
        else:
            rootdir.require_root(self.root)
        refuse_linked(self.root)  # a `cp -al` copy: one set of files under two roots

    @property
    def out(self) -> Output:
        return Output(root_word=self.root_word())

    @property
    def err(self) -> Output:
        return Output(stderr=True, root_word=self.root_word())

    def root_word(self) -> str | None:
        """The root as a command a message names must be given it (``--root WORD``), or
        None when that command finds it by itself (it is the default root)."""
        if self._root_word is None or self._root_word[0] != self.root:  # once per root
            try:
                default = os.path.realpath(client_mod.default_root())
            except RuntimeError:  # no home for ~/.substrat: a command run as shown has none
                default = None
            same = os.path.realpath(self.root) == default
            self._root_word = (self.root, None if same else shell_word(self.root))
        return self._root_word[1]

    def connect(self) -> client_mod.Client:
        """A connected client; starts the daemon if none runs (unless --no-autostart)."""

        def started(pid: int) -> None:
            if self.json:
                return
            if self.new_root:  # a mistyped path makes a root too: say so, and where
                self.err.print(
                    f"substrat: created a new root at {esc(self.root)} and started its daemon "
                    f"(pid {pid})"
                )
            else:
                self.err.print(
                    f"[dim]substrat: started the daemon (pid {pid}) for {esc(self.root)}[/]"
                )

        return client_mod.connect_or_start(
            self.root,
            autostart=self.autostart,
            timeout_s=self.timeout_s,
            on_start=started,
            create=bool(self.creates_root),
        )

    def frozen_check(self) -> Callable[[float], None]:
        """``on_silence`` for a call allowed a long silence (a turn waits up to 600 s): the
        daemon is pinged on a second connection; one that answers is busy, one that does
        not (SIGSTOP, a hung event loop) is given up on now, as other commands would."""

        def check(silent_s: float) -> None:
            if client_mod.ping(self.root, timeout_s=PING_S) is not None:
                return
            from substrat.rpc import lock

            info = lock.read_info(self.root)
            pid = f" (pid {info.pid})" if info is not None and info.pid is not None else ""
            raise RequestTimeoutError(
                f"the daemon{pid} has said nothing for {silent_s:.0f}s and does not answer a "
                f"ping either: it is stopped (SIGSTOP? `kill -CONT`) or stuck (see "
                f"{self.root / client_mod.LOG_NAME}); the request may or may not have been "
                "applied: check with `substrat log` once it answers"
            )

        return check

    def call(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        protocol.check_text(params)  # bad input costs only itself: no daemon, no new root
        with self.connect() as conn:
            return conn.call(method, params, **kw)


class RootPath(click.Path):
    """The type of every --root: a path, but not an empty one.

    ``--root "$DIR"`` with DIR unset passes "", which a plain path type takes for the
    current directory: ``daemon start`` then made whatever empty directory the shell was
    in a root. (An empty $SUBSTRAT_HOME is unset, as click and the daemon read it.)
    """

    def __init__(self) -> None:
        super().__init__(path_type=Path, readable=False)  # an unreadable root: our one line

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value == "":
            self.fail(
                'the path is empty (an unset variable in `--root "$DIR"`?); give a '
                "directory, or leave --root out to use $SUBSTRAT_HOME or ~/.substrat",
                param,
                ctx,
            )
        path = Path(os.fsdecode(super().convert(value, param, ctx)))  # (path_type=Path)
        try:
            path.expanduser()  # what _resolve does: `~nosuchuser/x` raised a traceback there
        except RuntimeError:
            head = path.parts[0]
            self.fail(
                f"{shown(head)} names no home directory (no such user, or HOME is unset); "
                f"write {shell_word(f'./{path}')} for a directory named {shown(head)} here, or "
                "give the path in full",
                param,
                ctx,
            )
        return path

    def fail(
        self, message: str, param: click.Parameter | None = None, ctx: click.Context | None = None
    ) -> NoReturn:
        # A bad $SUBSTRAT_HOME was reported as "Invalid value for '--root'", an option the
        # user never gave: name the variable they set.
        name = param.name if param is not None else None
        source = ctx.get_parameter_source(name) if ctx is not None and name else None
        if source is ParameterSource.ENVIRONMENT:
            raise click.BadParameter(message, ctx=ctx, param_hint="$SUBSTRAT_HOME")
        super().fail(message, param, ctx)


def _root_option(func: F) -> F:
    return click.option(
        "--root",
        type=RootPath(),
        envvar="SUBSTRAT_HOME",
        default=None,
        help="Substrat root (default: $SUBSTRAT_HOME or ~/.substrat; a leading ~ is expanded, "
        "even quoted).",
    )(func)


def _json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")(
        func
    )


def offline_command(
    *, creates_root: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Adds --root and --json; the command receives ``opts`` first.

    Unless ``creates_root``, the command refuses a path that is not a root yet.
    """

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @_root_option
        @_json_option
        @functools.wraps(func)
        def wrapper(root: Path | None, as_json: bool, **kwargs: Any) -> Any:
            opts = Opts(_resolve(root), as_json or group_json(), creates_root=creates_root)
            return guarded(opts, func, **kwargs)

        return wrapper

    return decorate


def daemon_command(
    default_timeout_s: float = client_mod.DEFAULT_TIMEOUT_S, *, creates_root: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Adds --root, --json, --timeout and --no-autostart; the command receives ``opts``.

    Unless ``creates_root``, the command refuses a path that is not a root yet
    (and so never starts a daemon there).
    """

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @_root_option
        @_json_option
        @click.option(
            "--timeout",
            "timeout_s",
            type=click.FloatRange(min=0.1),
            default=default_timeout_s,
            show_default=True,
            help="Seconds of daemon silence before giving up.",
        )
        @click.option(
            "--no-autostart",
            is_flag=True,
            envvar="SUBSTRAT_NO_AUTOSTART",
            help="Fail instead of starting the daemon when none runs.",
        )
        @functools.wraps(func)
        def wrapper(
            root: Path | None, as_json: bool, timeout_s: float, no_autostart: bool, **kwargs: Any
        ) -> Any:
            opts = Opts(
                _resolve(root), as_json or group_json(), timeout_s, not no_autostart, creates_root
            )
            return guarded(opts, func, **kwargs)

        return wrapper

    return decorate


def group_options(func: F) -> F:
    """--root and --json on a group, for ``substrat --root R agent --json list``.

    A command reads them through click's context (:func:`group_root`,
    :func:`group_json`), so each works before the group, after it, or after the
    command, where a user is likely to put it.
    """
    func = click.option(
        "--json",
        "group_json",
        is_flag=True,
        help="Machine-readable JSON output for the command that follows (as its own --json).",
    )(func)
    return click.option(
        "--root",
        "group_root",
        type=RootPath(),
        default=None,
        help="Substrat root for the command that follows (the command's own --root wins, "
        "then the nearest group's; default: $SUBSTRAT_HOME or ~/.substrat; a leading ~ is "
        "expanded, even quoted).",
    )(func)


def _resolve(root: Path | None) -> Path:
    """The root: the command's own --root, else the nearest group's (``substrat --root DIR
    agent list``), else $SUBSTRAT_HOME, else ~/.substrat."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.get_parameter_source("root") is not ParameterSource.COMMANDLINE:
        root = group_root() or root
    try:
        return (root if root is not None else client_mod.default_root()).expanduser().absolute()
    except RuntimeError:  # no HOME and no passwd entry: no ~ to take the default root from
        raise click.UsageError(
            "no home directory for the default root ~/.substrat (HOME is unset and your uid "
            "has no passwd entry); give --root or set SUBSTRAT_HOME"
        ) from None


def _groups() -> Iterator[click.Context]:
    """The contexts of the groups above the running command, nearest first."""
    ctx = click.get_current_context(silent=True)
    parent = ctx.parent if ctx is not None else None
    while parent is not None:
        yield parent
        parent = parent.parent


def group_root() -> Path | None:
    """The --root given before the command name (``substrat agent --root DIR list``)."""
    for ctx in _groups():
        value = ctx.params.get("group_root")
        if isinstance(value, Path):
            return value
    return None


def group_json() -> bool:
    """Whether --json was given before the command name (``substrat --json agent list``)."""
    return any(ctx.params.get("group_json") for ctx in _groups())


def guarded(opts: Opts, func: Callable[..., Any], **kwargs: Any) -> Any:
    """Check the root, run a command body; turn substrat errors into a message and exit code."""
    try:
        opts.check_root()
        return func(opts, **kwargs)
    except RpcError as exc:
        fail(opts, reword(exc, func.__name__), EXIT_FAILED, code=exc.code)
    except (RootError, SocketPathTooLongError, FsckError, BadInputError) as exc:
        fail(opts, exc, EXIT_USAGE)
    except (DaemonError, RootLockedError) as exc:
        fail(opts, exc, EXIT_UNAVAILABLE)
    except SubstratError as exc:
        fail(opts, exc, EXIT_FAILED)
    except BrokenPipeError as exc:
        if stdout_closed():
            leave_quietly()
        fail(opts, DaemonError(f"talking to the daemon failed: {exc}"), EXIT_UNAVAILABLE)
    except (ConnectionError, TimeoutError) as exc:  # the socket, not the root's files
        fail(opts, DaemonError(f"talking to the daemon failed: {exc}"), EXIT_UNAVAILABLE)
    except OSError as exc:
        # A root the host made unusable midway (modes, a read-only mount, a full disk, a
        # failing device) that no check foresaw: one line with what to do, not a traceback.
        from substrat import access

        fail(opts, RootUnusableError(access.failed(exc, then="run the command again")), EXIT_USAGE)
    except KeyboardInterrupt:
        sys.exit(130)


def stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (``| head -1`` read its
    line): a broken pipe there is not the daemon's, whose socket errors the client words."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _fd, events in poller.poll(0))
    except (AttributeError, ValueError, OSError):
        return False


def fail(opts: Opts, exc: BaseException, exit_code: int, *, code: int | None = None) -> None:
    """Report an error on stderr (JSON with --json) and exit."""
    message = str(exc)
    root_word = opts.root_word()
    if root_word is not None:  # the commands it tells the user to run act on this root
        message = rooted(message, root_word)
    if opts.json:
        body: dict[str, Any] = {"type": type(exc).__name__, "message": message}
        if code is not None:
            body["code"] = code
        click.echo(json.dumps({"error": body}), err=True)
    else:
        # the root named in any message (the daemon's too) on one line, as `shown` writes it
        for root in (opts.root, os.path.realpath(opts.root)):  # the daemon's is the real one
            message = shown_in(message, root)
        message = visible(message)
        opts.err.print(f"[bold red]error:[/] {escape(message)}")
    sys.exit(exit_code)


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False))


# Control characters a terminal acts on (cursor moves, colours, window titles, clipboard
# writes through OSC 52, a carriage return that overwrites the line), mapped to their
# visible escapes. Newline and tab stay: they are how text is laid out.
_CONTROLS = {
    code: f"\\x{code:02x}"
    for code in (*range(0x00, 0x20), *range(0x7F, 0xA0))
    if chr(code) not in "\n\t"
}


def visible(text: str) -> str:
    """``text`` with its control characters shown as ``\\x1b`` and the like, not obeyed.

    A model's answer, a prompt or a log line is untrusted: printed raw to a
    terminal, an escape sequence in it could recolour, hide or rewrite what the
    user reads, or set their clipboard.
    """
    return text.translate(_CONTROLS)


def for_terminal(text: str) -> str:
    """``text`` made :func:`visible` when stdout is a terminal; raw into a pipe or a file."""
    stdout = sys.stdout  # None when the command started with it closed (`>&-`)
    return visible(text) if stdout is not None and stdout.isatty() else text


def esc(text: object) -> str:
    """Escape text for rich markup, its control characters made visible (a path as
    :func:`~substrat.shellword.shown` writes it: on one line, and unambiguous)."""
    return escape(visible(shown(text) if isinstance(text, PurePath) else str(text)))


def lazy_module(name: str) -> ModuleType:
    """Module ``name``, run on first use of one of its attributes.

    The command modules take their rich renderers (``render``) and their lines
    (``lines``, with the session model it may need) this way: a command loads them
    only when it prints what needs them.
    """
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None, f"no module {name}"
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)
    spec.loader.exec_module(module)
    return module


class LazyChoice(click.Choice):
    """A ``click.Choice`` whose choices are looked up when an option of it is used or shown.

    The provider names come from an entry-point scan of every installed package,
    which every command would otherwise pay at start-up; a value among ``sure`` (the
    built-in names) is accepted without it.
    """

    def __init__(self, names: Callable[[], Sequence[str]], sure: Sequence[str] = ()) -> None:
        self._names = names
        self._sure = frozenset(sure)
        """Names certainly among ``names()``: one of them is taken without the look-up."""
        self._choices: tuple[str, ...] | None = None
        super().__init__(())

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        # What click's Choice returns for a name in the list, as it is written: that name.
        if (
            isinstance(value, str)
            and value in self._sure
            and self.case_sensitive
            and (ctx is None or ctx.token_normalize_func is None)
        ):
            return value
        return super().convert(value, param, ctx)

    @property
    def choices(self) -> tuple[str, ...]:
        if self._choices is None:
            self._choices = tuple(self._names())
        return self._choices

    @choices.setter
    def choices(self, value: Sequence[str]) -> None:
        assert not value, "the choices come from the function given"
