"""`maskrcnn-launch`'s user mistakes: one `error:` line per problem on stderr, exit 2 (3: master
unreachable), through the real console script in a subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

CASES = [
    ("topology-binary", ["plan", "--topology", "{binary}"], ["topology", "binary.yaml", "not a text"]),
    ("topology-folder", ["plan", "--topology", "{tmp}"], ["neither a file nor a packaged topology"]),
    ("topology-missing", ["validate", "--topology", "{tmp}/none.yaml"], ["neither a file nor a packaged topology"]),
    ("topology-not-yaml", ["validate", "--topology", "{bad-yaml}"], ["bad.yaml: not valid YAML"]),
    ("topology-list", ["validate", "--topology", "{list-yaml}"], ["expected a mapping"]),
    ("topology-key-twice", ["plan", "--topology", "{twice-yaml}"], ["twice.yaml", "found the key 'replicas' twice"]),
    ("unknown-command", ["pla"], ["pla"]),
    ("plan-prefix-not-a-dns-label", ["plan", "--prefix", "My_Release"], ["--prefix", "'My_Release' is not a DNS name"]),
    ("plan-namespace-empty", ["plan", "--namespace", ""], ["--namespace", "'' is not a DNS name"]),
    ("plan-cluster-domain", ["plan", "--cluster-domain", "cluster..local"], ["--cluster-domain", "not a DNS name"]),
    ("wait-timeout", ["launch", "--role", "master", "--wait-timeout", "-1"], ["--wait-timeout"]),
    ("no-identity", ["launch", "--dry-run"], []),
    ("wait-timeout-nan", ["local", "--wait-timeout", "nan"], ["--wait-timeout", "finite"]),
    ("grace-zero", ["local", "--grace", "0"], ["--grace"]),
    ("master-port-range", ["launch", "--master-port", "70000"], ["--master-port"]),
    ("index-negative", ["launch", "--index", "-1"], ["--index"]),
    (
        "topology-count-beyond-any-machine",
        ["validate", "--topology", "{huge-yaml}"],
        ["workers[0].devices", "above the maximum"],
    ),
    (  # the default topology is a pipeline: a trainer --engine ddp would silently win over it
        "local-engine-contradicts-topology",
        ["local", "--", "--engine", "ddp", "--max-steps", "1"],
        ["--engine ddp contradicts the topology's engine pipeline"],
    ),
    (  # the default topology is a pipeline: nothing could take a restarted stage worker back
        "local-restart-workers-pipeline",
        ["local", "--restart-workers", "1", "--", "--max-steps", "1"],
        ["--restart-workers 1", "elastic ddp job only"],
    ),
    (
        "local-restart-workers-not-elastic",
        ["local", "--topology", "ddp", "--restart-workers", "2", "--", "--no-elastic"],
        ["--restart-workers 2", "drop --no-elastic"],
    ),
    (
        "launch-engine-contradicts-topology",
        ["launch", "--role", "master", "--dry-run", "--", "--engine=ddp"],
        ["--engine ddp contradicts the topology's engine pipeline"],
    ),
    (  # strict parsing: an option `launch` does not have is refused, and nothing after it reaches the trainer
        "launch-unknown-option-before-dashes",
        ["launch", "--role", "master", "--restart-workers", "1", "--dry-run", "--", "--epochs", "1"],
        ["no such option: --restart-workers", "the trainer's arguments go after `--`"],
    ),
    (
        "launch-trainer-option-without-dashes",
        ["launch", "--role", "master", "--dry-run", "--epochs", "1"],
        ["no such option: --epochs", "after `--`"],
    ),
    ("launch-stray-word", ["launch", "--role", "master", "worker", "--dry-run"], ["unexpected argument 'worker'"]),
    (  # after `--` the trainer would get it (and start): the kit's trainer has none of the launcher's options
        "launch-own-option-after-dashes",
        ["launch", "--role", "master", "--", "--epochs", "1", "--dry-run"],
        ["--dry-run after `--` goes to the trainer, which has no such option", "give it before `--`"],
    ),
    (
        "local-own-option-after-dashes",
        ["local", "--topology", "ddp", "--", "--restart-workers=1"],
        ["--restart-workers after `--` goes to the trainer"],
    ),
    (
        "local-misspelt-option",
        ["local", "--topology", "ddp", "--restart-worker", "1", "--", "--epochs", "1"],
        ["no such option: --restart-worker", "--restart-workers"],
    ),
    (  # every option given twice, whatever the command: click would keep the last one silently
        "launch-option-twice",
        ["launch", "--topology", "ddp", "--role", "master", "--topology=three-machines", "--dry-run"],
        ["--topology is given more than once (--topology ddp, --topology=three-machines)", "give it once"],
    ),
    ("local-option-without-its-value", ["local", "--grace", "--", "-x"], ["Option '--grace' requires an argument"]),
    ("local-flag-twice", ["local", "--grace", "5", "--grace", "6", "--", "-x"], ["--grace is given more than once"]),
    ("plan-flag-twice", ["plan", "--json", "--json"], ["--json is given more than once (--json, --json)"]),
    ("plan-option-twice", ["plan", "--namespace", "a", "--namespace", "b"], ["--namespace is given more than once"]),
    (
        "local-engine-that-no-topology-has",
        ["local", "--topology", "ddp", "--", "--engine", "local"],
        ["--engine local contradicts the topology's engine ddp", "one process", "`maskrcnn-dist train --engine local"],
    ),
    (
        "launch-engine-that-does-not-exist",
        ["launch", "--role", "master", "--dry-run", "--", "--engine", "dpp"],
        ["--engine 'dpp' (did you mean 'ddp'?) is not an engine", "the topology's, pipeline, is passed"],
    ),
    (
        "trainer-cmd-unclosed-quote",
        ["launch", "--role", "master", "--dry-run", "--trainer-cmd", "'python -m x"],
        ["--trainer-cmd", "No closing quotation"],
    ),
    (
        "trainer-cmd-blank",
        ["launch", "--role", "master", "--dry-run", "--trainer-cmd", " "],
        ["--trainer-cmd", "no command"],
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "args", "fragments"), CASES, ids=[c[0] for c in CASES])
def test_launcher_user_errors_exit_2(console, tmp_path: Path, case: str, args: list[str], fragments: list[str]):
    files = {
        "binary": tmp_path / "binary.yaml",
        "bad-yaml": tmp_path / "bad.yaml",
        "list-yaml": tmp_path / "l.yaml",
        "huge-yaml": tmp_path / "huge.yaml",
        "twice-yaml": tmp_path / "twice.yaml",
    }
    files["binary"].write_bytes(bytes(range(256)))
    files["huge-yaml"].write_text(f"engine: ddp\nworkers: [{{devices: {2**70}}}]\n")  # a typo, not a machine
    files["bad-yaml"].write_text("engine: [unclosed\n")
    files["list-yaml"].write_text("- 1\n")
    files["twice-yaml"].write_text("workers:\n  - {devices: 0, stage: s1, replicas: 1, replicas: 2}\n")
    values = {"tmp": str(tmp_path), **{k: str(v) for k, v in files.items()}}
    env = {"POD_NAME": "", "HOSTNAME": "not-a-pod", "MASKRCNN_TOPOLOGY": ""}
    result = console("maskrcnn-launch", *[a.format(**values) for a in args], env=env)
    assert result.code == 2, result.stderr
    assert result.error_lines and all(line.startswith("error: ") for line in result.error_lines), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_trainer_engine_argument_that_agrees_with_the_topology_is_passed_on():
    from maskrcnn_launcher.errors import LauncherError
    from maskrcnn_launcher.launch import check_engine_args

    check_engine_args("pipeline", ["--engine", "pipeline", "--lr", "0.01"])
    check_engine_args("ddp", ["--engine=ddp"])
    with pytest.raises(LauncherError, match="--engine ddp contradicts the topology's engine pipeline"):
        check_engine_args("pipeline", ["--lr", "0.01", "--engine", "ddp"])


@pytest.mark.slow
def test_an_option_of_the_launcher_after_dashes_reaches_a_trainer_of_the_user_s_own(console) -> None:
    """--trainer-cmd is the user's program, whose options the launcher cannot know: passed on as given."""
    import json

    result = console(
        "maskrcnn-launch", "launch", "--role", "master", "--trainer-cmd", "mine", "--dry-run", "--", "--dry-run"
    )
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["argv"] == ["mine", "--dry-run"]
