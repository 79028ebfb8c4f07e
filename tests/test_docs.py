"""The documentation stays true: README.md, docs/, launcher/README.md and helm/README.md.

- every relative link names a file of the checkout, and every `#anchor` a heading of its page
  (GitHub's slugs);
- every `maskrcnn-dist SUB --flag`, `maskrcnn-launch SUB --flag` and `make TARGET` the pages show (in
  code blocks and inline code) exists: subcommands and flags are read from the click command trees,
  make targets from the Makefile and mk/*.mk;
- every default a page states for a flag ("the default `--lr 0.01`") is one the flag has;
- docs/reference/flags.md is what `make docs` (docs/hack/flags_page.py) writes;
- the README and every page stay short; the cluster walkthrough's values render with the chart.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "launcher" / "README.md", ROOT / "helm" / "README.md", *(ROOT / "docs").rglob("*.md")]
)
GENERATED = {ROOT / "docs" / "reference" / "flags.md"}
README_MAX_LINES = 200
PAGE_MAX_LINES = 250
ALWAYS_ACCEPTED = {"--help", "-h", "--debug"}

FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def split_page(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, code lines): fenced blocks are code, the rest prose."""
    prose, code, fenced = [], [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        (code if fenced else prose).append(line)
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (links as their text, code without backticks),
    lower case, punctuation other than '-' and '_' dropped, spaces as '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in split_page(page.read_text())[0]:
        if m := HEADING.match(line):
            base = slug(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> Iterator[str]:
    for line in split_page(page.read_text())[0]:
        line = INLINE_CODE.sub("", line)
        yield from (m.group(2) for m in LINK.finditer(line))


def link_problem(page: Path, target: str) -> str | None:
    """Why a link of `page` does not resolve, or None (external links are not followed)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):
        return None
    path_part, _, anchor = target.partition("#")
    dest = (page.parent / path_part).resolve() if path_part else page
    if ROOT not in dest.parents and dest != ROOT:
        return f"{target}: outside the checkout"
    if not dest.exists():
        return f"{target}: no such file"
    if anchor:
        if dest.suffix != ".md":
            return f"{target}: an anchor into a file that is not a page"
        if anchor not in anchors(dest):
            return f"{target}: no heading #{anchor} in {_rel(dest)}"
    return None


def broken_links(page: Path) -> list[str]:
    return [problem for target in links(page) if (problem := link_problem(page, target))]


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


# ------------------------------------------------------------------------------------------------
# Commands, flags and make targets shown in the pages
# ------------------------------------------------------------------------------------------------


def command_trees() -> dict[str, click.Group]:
    from maskrcnn_launcher import cli as launcher_cli

    from maskrcnn_dist import cli as trainer_cli

    return {"maskrcnn-dist": trainer_cli.main, "maskrcnn-launch": launcher_cli.main}


def accepted_flags(command: click.Command) -> set[str]:
    return {name for p in command.params if isinstance(p, click.Option) for name in p.opts + p.secondary_opts}


# `maskrcnn-dist SUB`, `maskrcnn-launch SUB`, and the module forms (`-m maskrcnn_dist.cli SUB`).
INVOCATION = re.compile(
    r"(?<![\w.-])(maskrcnn-dist|maskrcnn-launch|maskrcnn_dist\.cli|maskrcnn_launcher)\s+([a-z][a-z-]*)"
)
PROGRAMS = {"maskrcnn_dist.cli": "maskrcnn-dist", "maskrcnn_launcher": "maskrcnn-launch"}
FLAG = re.compile(r"(?<![\w$-])(--[a-z][a-z0-9-]*|-h)(?![\w-])")
# Where a shown command ends: a comment, the next command of a line, a sub-shell's or a string's end.
COMMAND_END = re.compile(r"\s#|&&|;|\)|\"|'|\|\s*[a-z]")


def shown_commands(text: str) -> Iterator[tuple[str, str, list[str], list[str]]]:
    """(program, subcommand, its flags, the trainer flags after ` -- `) of every command the page
    shows in code: fenced blocks (continuation lines joined) and inline code."""
    prose, code = split_page(text)
    snippets = re.sub(r"\\\n\s*", " ", "\n".join(code)).splitlines()
    snippets += [m.group(1) for line in prose for m in INLINE_CODE.finditer(line)]
    for snippet in snippets:
        for m in INVOCATION.finditer(snippet):
            rest = snippet[m.end() :]
            if end := COMMAND_END.search(rest):
                rest = rest[: end.start()]
            own, _, trainer = rest.partition(" -- ")
            program = PROGRAMS.get(m.group(1), m.group(1))
            yield program, m.group(2), FLAG.findall(own), FLAG.findall(trainer)


def command_problems(page: Path, trees: dict[str, click.Group]) -> list[str]:
    problems = []
    for program, sub, flags, trainer_flags in shown_commands(page.read_text()):
        command = trees[program].commands.get(sub)
        if command is None:
            problems.append(f"{program} {sub}: no such subcommand")
            continue
        if program == "maskrcnn-dist" and sub == "status":  # it runs `maskrcnn-launch status`
            command = trees["maskrcnn-launch"].commands["status"]
        checks = [(f"{program} {sub}", command, flags)]
        if program == "maskrcnn-launch" and sub in ("launch", "local"):  # after `--`: the trainer's flags
            train = trees["maskrcnn-dist"].commands["train"]
            checks.append((f"{program} {sub} -- (train)", train, trainer_flags))
        for name, cmd, shown in checks:
            known = accepted_flags(cmd) | ALWAYS_ACCEPTED
            problems += [f"{name}: no flag {flag}" for flag in shown if flag not in known]
    return problems


@pytest.fixture(scope="module")
def trees() -> dict[str, click.Group]:
    return command_trees()


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_command_and_flag_shown_exists(page: Path, trees) -> None:
    assert command_problems(page, trees) == []


# A default the prose states for a flag: "the default `--lr 0.01`", "`--best-metric` (default `segm_AP`",
# "`--wait-timeout`, default 300 s", "`--rpc-timeout` seconds (default 120". Only a value in code or a number
# is compared (not "default all of them").
STATED_DEFAULT = re.compile(
    r"default `(--[a-z][a-z0-9-]*) ([^`\s]+)`"
    r"|`(--[a-z][a-z0-9-]*)`(?: [a-z]+)?(?:,| \() ?default:? (?:`([^`]+)`|(-?[0-9][0-9.e-]*)(?![\w.]))"
)


def flag_defaults() -> dict[str, set[str]]:
    """Every default each flag has, in any command, as docs/reference/flags.md shows it (its config field's,
    else click's), and a "default N" its help names (a default that comes from the environment's contract)."""
    module = _flags_page_module()
    found: dict[str, set[str]] = {}
    for program, group in command_trees().items():
        for name, command in group.commands.items():
            for param in module.options(command):
                _, default, _, meaning = module.row(param, module.field_spec(program, name, param))
                values = {default.strip("`")} | set(re.findall(r"default:? ([^\s;,)\]]+)", meaning))
                for flag in param.opts:
                    found.setdefault(flag, set()).update(values - {""})
    return found


def same_value(stated: str, default: str) -> bool:
    try:
        return float(stated) == float(default)
    except ValueError:
        return stated == default


def default_problems(page: Path, defaults: dict[str, set[str]]) -> list[str]:
    """A flag's default as a page states it that no command of that flag has."""
    problems = []
    for line in split_page(page.read_text())[0]:
        for m in STATED_DEFAULT.finditer(line):
            flag = m.group(1) or m.group(3)
            stated = m.group(2) or m.group(4) or m.group(5)
            known = defaults.get(flag)
            if known and not any(same_value(stated, d) for d in known):
                problems.append(f"{flag}: the page says its default is {stated}, the code's is {sorted(known)}")
    return problems


@pytest.fixture(scope="module")
def defaults() -> dict[str, set[str]]:
    return flag_defaults()


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_default_stated_for_a_flag_is_its_default(page: Path, defaults) -> None:
    assert default_problems(page, defaults) == []


def test_a_wrong_stated_default_is_found(tmp_path: Path, defaults) -> None:
    page = tmp_path / "page.md"
    page.write_text("at the default `--lr 0.02`; `--print-freq` (default `7`); `--wait-timeout`, default 30 s\n")
    assert [p.split(":")[0] for p in default_problems(page, defaults)] == ["--lr", "--print-freq", "--wait-timeout"]
    page.write_text("at the default `--lr 0.01`; `--wait-timeout`, default 300 s; `--threads`, default all\n")
    assert default_problems(page, defaults) == []


def make_targets() -> set[str]:
    targets = set()
    for makefile in [ROOT / "Makefile", *sorted((ROOT / "mk").glob("*.mk"))]:
        for line in makefile.read_text().splitlines():
            if m := re.match(r"^([A-Za-z0-9_.-]+(?:\s+[A-Za-z0-9_.-]+)*)\s*:(?![=:])", line):
                targets.update(m.group(1).split())
    return targets


MAKE = re.compile(r"(?<![\w$/.-])make\s+((?:[A-Za-z0-9_.-]+(?:=\S*)?\s*)+)")


def make_problems(page: Path, targets: set[str]) -> list[str]:
    prose, code = split_page(page.read_text())
    snippets = code + [m.group(1) for line in prose for m in INLINE_CODE.finditer(line)]
    shown = {word for s in snippets for m in MAKE.finditer(s) for word in m.group(1).split() if "=" not in word}
    return sorted(f"make {t}: no such target" for t in shown - targets)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_make_target_shown_exists(page: Path) -> None:
    assert make_problems(page, make_targets()) == []


# ------------------------------------------------------------------------------------------------
# The generated flags page, lengths, the walkthrough's values
# ------------------------------------------------------------------------------------------------


def _flags_page_module():
    spec = importlib.util.spec_from_file_location("flags_page", ROOT / "docs" / "hack" / "flags_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_flags_reference_is_what_make_docs_writes() -> None:
    module = _flags_page_module()
    assert module.PAGE.read_text() == module.render(), "docs/reference/flags.md is stale: run `make docs`"


def test_the_readme_and_every_page_stay_short() -> None:
    lengths = {_rel(p): len(p.read_text().splitlines()) for p in PAGES}
    assert lengths["README.md"] <= README_MAX_LINES
    long = {p: n for p, n in lengths.items() if n > PAGE_MAX_LINES and ROOT / p not in GENERATED}
    assert long == {} or set(long) <= {"launcher/README.md"}, long  # the launcher's reference is its own


@pytest.mark.needs_helm
def test_the_walkthrough_values_render_as_a_jobset(helm: str, tmp_path: Path) -> None:
    """docs/cluster-walkthrough.md's values with profile's for the packaged ddp topology (the page's
    example of that file is what profile writes), as its `helm template` command renders them for a
    cluster with JobSet."""
    from maskrcnn_dist.profile.write import write_values

    page = (ROOT / "docs" / "cluster-walkthrough.md").read_text()
    block = re.search(r"<!-- test: walkthrough-values -->\s*```yaml\n(.*?)```", page, re.S).group(1)
    (tmp_path / "my-values.yaml").write_text(block)
    topology = yaml.safe_load((ROOT / "launcher" / "maskrcnn_launcher" / "topologies" / "ddp.yaml").read_text())
    topology["estimate"].update(batch_size=4, micro_batches=2)  # what profile measured at, as the page's args
    write_values(tmp_path / "profile-values.yaml", topology)
    example = re.search(r"<!-- test: profile-values-example -->\s*```yaml\n(.*?)```", page, re.S).group(1)
    assert example == (tmp_path / "profile-values.yaml").read_text(), "the page's example is not what profile writes"
    proc = subprocess.run(
        [helm, "template", "coco", str(ROOT / "helm"), "-n", "ml", "-f", str(tmp_path / "profile-values.yaml")]
        + ["-f", str(tmp_path / "my-values.yaml"), "--api-versions", "jobset.x-k8s.io/v1alpha2"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    objects = [o for o in yaml.safe_load_all(proc.stdout) if o]
    (jobset,) = [o for o in objects if o["kind"] == "JobSet"]
    assert jobset["metadata"]["name"] == "coco-maskrcnn-dist"
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example.com/ml/maskrcnn-dist:0.1.0"
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"coco-data-maskrcnn-dist-data"}
    assert "/data/runs/coco" in pod["containers"][0]["args"]
