"""Strict command lines for every entry point of both packages (the error boundary's groups use them).

click keeps the last value of an option given twice, silently: `--data-path a ... --data-path b` trains
on b, and `--elastic ... --no-elastic` is not elastic. Here any option given more than once, other than
one declared `multiple` or `count`, is refused in one line that shows each occurrence.

A command that hands arguments on to another program (`launch`, `local`: the trainer's) takes them only
after `--`: before it, every word is the command's own, so a misspelt or misplaced option (`--dry-run`
after an unknown one, `--restart-workers` on `launch`) is refused instead of reaching the trainer, which
would start anyway. Only click is imported: the launcher runs without torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

__all__ = ["PassThroughCommand", "StrictCommand", "refuse_own_options_passed_on", "refuse_repeated_options"]

END_OF_OPTIONS = "--"


def refuse_repeated_options(command: click.Command, ctx: click.Context, args: Sequence[str]) -> None:
    """UsageError naming the first option of `command` that `args` give twice (up to `--`)."""
    parser = command.make_parser(ctx)
    try:
        _, _, order = parser.parse_args(args=list(args))
    except click.UsageError:
        return  # click's own refusal of these arguments follows, in the command's parse
    seen: set[str] = set()
    for param in order:
        if not isinstance(param, click.Option) or param.multiple or param.count or param.name is None:
            continue
        if param.name in seen:
            shown = ", ".join(_occurrences(param, args)) or "twice"
            name = "/".join(param.opts + param.secondary_opts)
            raise click.UsageError(f"{name} is given more than once ({shown}): only one can count; give it once", ctx)
        seen.add(param.name)


def _occurrences(param: click.Option, args: Sequence[str]) -> list[str]:
    """How each occurrence of `param` was written in `args` (`--flag value`, `--flag=value`, `--no-flag`)."""
    names = set(param.opts + param.secondary_opts)
    words = list(args[: args.index(END_OF_OPTIONS)] if END_OF_OPTIONS in args else args)
    shown = []
    for i, word in enumerate(words):
        name = word.split("=", 1)[0]
        if name not in names:
            continue
        takes_value = not param.is_flag and "=" not in word and i + 1 < len(words)
        shown.append(f"{word} {words[i + 1]}" if takes_value else word)
    return shown


def refuse_own_options_passed_on(ctx: click.Context, passed: Sequence[str], program: str) -> None:
    """UsageError for an option of this command given after `--`, where `program` gets it instead: call it
    when `program` is one known to have no option of that name (`launch -- --dry-run` would start the job,
    and the trainer refuse --dry-run only once it runs)."""
    own = {name for p in ctx.command.params if isinstance(p, click.Option) and not p.hidden for name in p.opts}
    for word in passed:
        if (name := word.split("=", 1)[0]) in own:
            raise click.UsageError(
                f"{name} after `--` goes to {program}, which has no such option: it is this command's own; give it "
                "before `--`",
                ctx,
            )


class StrictCommand(click.Command):
    """A click command that refuses an option given twice (module docstring)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        refuse_repeated_options(self, ctx, args)
        return super().parse_args(ctx, args)


class PassThroughCommand(StrictCommand):
    """A command whose last parameter, a variadic argument, is another program's arguments: given after
    `--`, the only way in. Before `--` the command's own options only, parsed strictly: an unknown option or a
    stray word is refused (click would otherwise pass it, and everything after it, to that program)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        cut = args.index(END_OF_OPTIONS) if END_OF_OPTIONS in args else len(args)
        own, passed = args[:cut], args[cut + 1 :]
        parser = self.make_parser(ctx)
        try:
            opts, stray, _ = parser.parse_args(args=list(own))
        except click.NoSuchOption as exc:
            raise click.NoSuchOption(
                exc.option_name,
                f"no such option: {exc.option_name} (the trainer's arguments go after `--`)",
                exc.possibilities,
                ctx,
            ) from None
        # (Any other error of its own words is raised here, as they stand: an option's missing value must not
        # become the `--` after it.) A word before `--` that no option took: the variadic argument would take it.
        taken = [opts.get(p.name) for p in self.params if isinstance(p, click.Argument)]
        stray = [*stray, *(word for words in taken if isinstance(words, (list, tuple)) for word in words)]
        if stray:
            raise click.UsageError(
                f"unexpected argument {stray[0]!r}: this command's options come before `--`, and the "
                "trainer's arguments after it",
                ctx,
            )
        return super().parse_args(ctx, [*own, END_OF_OPTIONS, *passed] if END_OF_OPTIONS in args else own)
