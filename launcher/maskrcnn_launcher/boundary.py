"""The error boundary of every entry point: `maskrcnn-launch`, `maskrcnn-dist`, and the trainer processes
the launcher starts (`python -m maskrcnn_dist.cli ...`, under torchrun or not).

Exit codes are part of the pod contract: a JobSet's podFailurePolicy fails the job at once on
EXIT_USER_ERROR instead of restarting the group over the same mistake, and anything else counts as a
crash to recover from. So every failure leaves through here, as one line on stderr:

    EXIT_OK (0)            done
    EXIT_USER_ERROR (2)    the user can fix it: a flag, a field, a file (its name is in the line)
    EXIT_RUNTIME (1)       anything else; the traceback only with --debug or MASKRCNN_DEBUG=1
    EXIT_UNREACHABLE (3)   the launcher could not reach the master (`launch`, `wait-master`)
    EXIT_STOPPED (75)      stopped by SIGTERM/SIGINT at a step boundary, nothing finished lost: the trainer
                           wrote a checkpoint of its last finished step (or had finished none since the
                           newest one); `--resume auto` goes on from there. sysexits' EX_TEMPFAIL: try again
    EXIT_INTERRUPTED (130) Ctrl-C / SIGINT to a process that does not stop cleanly (128 + SIGINT)
    EXIT_TERMINATED (143)  the same for SIGTERM, or a second signal that ended a stop early (128 + SIGTERM)

Every exit code is written here and only here; the other modules use these names.

Each package adds what it knows about its own exceptions through `classify`; what is common (click's
usage errors, the launcher's errors, OS errors on a named path) is decided here, once. Standard library
and click only: the launcher imports this without torch.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click

from maskrcnn_launcher.errors import LauncherError, PeerTimeout
from maskrcnn_launcher.strict import StrictCommand, refuse_repeated_options

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USER_ERROR = 2
EXIT_UNREACHABLE = 3
#: Stopped on request (SIGTERM, SIGINT) with nothing finished lost; the trainer (stop.py), its torchrun
#: wrapper and `maskrcnn-launch local` exit with it, and a JobSet's rules can tell it from a crash.
EXIT_STOPPED = 75  # sysexits.h EX_TEMPFAIL: a temporary failure, the same command will succeed later
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention for a signal
EXIT_TERMINATED = 143  # 128 + SIGTERM

#: Set to 1 to print the traceback of a runtime failure (same as the --debug flag of either CLI).
DEBUG_ENV = "MASKRCNN_DEBUG"
DEBUG_FLAG = "--debug"
_TRUE = ("1", "true", "yes", "on")
LINE_LIMIT = 400  # torch's messages can run to a page; one line is what a user (and `kubectl logs`) reads
# The kit's own refusals are worded to be read whole: the paths and files they name make some long.
OWN_LINE_LIMIT = 1200

# OS errors that mean "this path is not what the user said it is", as opposed to the machine failing.
_USER_PATH_ERRNOS = {"ENOENT", "EACCES", "EPERM", "EISDIR", "ENOTDIR", "EROFS", "EEXIST", "ENAMETOOLONG", "ELOOP"}


@dataclass(frozen=True)
class Failure:
    """How a failure leaves the process: its exit code and the lines printed after `error: `."""

    code: int
    lines: tuple[str, ...]

    @classmethod
    def of(cls, code: int, *lines: str, limit: int = LINE_LIMIT) -> Failure:
        return cls(code, tuple(one_line(line, limit) for line in lines))

    @classmethod
    def own(cls, code: int, *lines: str) -> Failure:
        """A refusal in the kit's own words (a user error: the file, field or flag and what to do), cut
        only past OWN_LINE_LIMIT, and then in its middle (one_line)."""
        return cls.of(code, *lines, limit=OWN_LINE_LIMIT)


class ExitWith(Exception):  # noqa: N818 (not an error: how a command asks for its exit code and line)
    """Leave with `code` and one `error:` line, e.g. `maskrcnn-launch local` passing on a pod's failure."""

    def __init__(self, code: int, line: str) -> None:
        super().__init__(line)
        self.code = code


#: A package's own knowledge: its exceptions -> a Failure, or None to leave the decision to the boundary.
Classifier = Callable[[BaseException], "Failure | None"]


def one_line(text: str, limit: int = LINE_LIMIT) -> str:
    """`text` on one line, shortened to `limit` characters from its middle: a message ends with its
    hint (the flag to pass, what to do), after its last "; ", and the middle (a list of files, a quoted
    value, a library's detail) is what can go. A last clause longer than half the line keeps its end."""
    flat = " ".join(str(text).split())
    if len(flat) <= limit:
        return flat
    cut = " ... "
    hint = flat.rsplit("; ", 1)[1] if "; " in flat else ""
    if not hint or len(hint) > limit // 2:
        hint = flat[-(limit // 3) :]
        hint = hint[hint.find(" ") + 1 :] if " " in hint[:-1] else hint  # from a word's start
    head = flat[: max(limit - len(cut) - len(hint), 0)]
    return head.rstrip("; ") + cut + hint


def debug_requested(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    return DEBUG_FLAG in _options_part(argv) or env.get(DEBUG_ENV, "").strip().lower() in _TRUE


def _options_part(argv: Sequence[str]) -> Sequence[str]:
    """argv up to `--` (after it come another program's arguments, e.g. `launch -- <trainer args>`)."""
    return argv[: argv.index("--")] if "--" in argv else argv


def without_debug_flag(argv: Sequence[str]) -> list[str]:
    """argv without --debug, wherever the user put it before `--` (it belongs to no single command)."""
    head = [a for a in _options_part(argv) if a != DEBUG_FLAG]
    return head + list(argv[len(_options_part(argv)) :])


def classify_common(exc: BaseException) -> Failure:
    """What every entry point decides the same way."""
    if isinstance(exc, ExitWith):
        return Failure.of(exc.code, str(exc))
    if isinstance(exc, (KeyboardInterrupt, click.exceptions.Abort)):
        return Failure.of(EXIT_INTERRUPTED, "interrupted")
    if isinstance(exc, click.UsageError):
        where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        return Failure.of(EXIT_USER_ERROR, exc.format_message() + where)
    if isinstance(exc, click.ClickException):
        return Failure.of(exc.exit_code, exc.format_message())
    if isinstance(exc, LauncherError):
        return Failure.own(EXIT_UNREACHABLE if isinstance(exc, PeerTimeout) else EXIT_USER_ERROR, *exc.errors)
    if isinstance(exc, OSError) and exc.filename is not None and _errno_name(exc) in _USER_PATH_ERRNOS:
        return Failure.of(EXIT_USER_ERROR, os_error_line(exc))
    if isinstance(exc, MemoryError):
        return Failure.of(EXIT_RUNTIME, "out of memory (host RAM): lower --batch-size, --workers or the image size")
    return Failure.of(EXIT_RUNTIME, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def os_error_line(exc: OSError) -> str:
    """`PATH: reason` (and the second path of a rename/copy)."""
    reason = exc.strerror or str(exc)
    if exc.filename2 is not None:
        return f"{exc.filename} -> {exc.filename2}: {reason}"
    return f"{exc.filename}: {reason}"


def _errno_name(exc: OSError) -> str:
    import errno

    return errno.errorcode.get(exc.errno or 0, "")


def report(failure: Failure, exc: BaseException, debug: bool, stream: Any = None) -> None:
    """Print `failure` (and, under --debug, the traceback) to stderr."""
    stream = stream or sys.stderr
    if debug:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=stream)
    lines = list(failure.lines) or ["failed"]
    if failure.code == EXIT_RUNTIME and not debug and not isinstance(exc, ExitWith):
        lines[-1] += f" ({DEBUG_FLAG} or {DEBUG_ENV}=1 shows the traceback)"
    for line in lines:
        print(f"error: {line}", file=stream)
    stream.flush()


class GuardedGroup(click.Group):
    """A click group whose every command runs inside the boundary: the console script, `python -m`, and
    click's CliRunner in tests all go through `main`. `classify` adds the package's own exceptions. Its
    commands, however made, and the group itself refuse an option given twice (strict.py)."""

    command_class = StrictCommand

    def __init__(self, *args: Any, classify: Classifier | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.classify = classify
        self.params.append(
            click.Option(
                [DEBUG_FLAG],
                is_flag=True,
                expose_value=False,
                help=f"on a failure, print the traceback too (also {DEBUG_ENV}=1; may be given anywhere)",
            )
        )

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        refuse_repeated_options(self, ctx, args)
        return super().parse_args(ctx, args)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """A subcommand made elsewhere (`@click.command`, then `add_command`) refuses a repeated option too."""
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None and not isinstance(command, (StrictCommand, click.Group)):
            own = click.Context(command, info_name=name, parent=ctx, **command.context_settings)
            refuse_repeated_options(command, own, rest)
        return name, command, rest

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        debug = debug_requested(argv, os.environ)
        if debug:  # the processes this one starts (launch, local, torchrun) show their tracebacks too
            os.environ[DEBUG_ENV] = "1"
        try:
            result = super().main(without_debug_flag(argv), prog_name, complete_var, standalone_mode=False, **extra)
        except SystemExit:
            raise
        except BaseException as exc:  # the boundary: KeyboardInterrupt included
            failure = (self.classify(exc) if self.classify else None) or classify_common(exc)
            report(failure, exc, debug)
            sys.exit(failure.code)
        code = result if isinstance(result, int) else EXIT_OK  # click returns --help's 0 without standalone_mode
        if standalone_mode:
            sys.exit(code)
        return result
