"""The launcher runs in small init steps and before the trainer exists: it must never import torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHECK = textwrap.dedent(
    """
    import pkgutil, sys
    import maskrcnn_launcher
    for mod in pkgutil.walk_packages(maskrcnn_launcher.__path__, "maskrcnn_launcher."):
        if not mod.name.endswith(".__main__"):
            __import__(mod.name)
    from click.testing import CliRunner
    from maskrcnn_launcher.cli import main
    for args in (["plan"], ["plan", "--json", "--topology", "ddp"], ["validate"],
                 ["launch", "--dry-run", "--role", "master", "--topology", "ddp"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "torchvision", "numpy"})
    assert not heavy, heavy
    print("clean")
    """
)


@pytest.mark.slow
def test_launcher_never_imports_torch() -> None:
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "clean"


@pytest.mark.slow
def test_module_entry_point_runs_without_torch() -> None:
    code = "import runpy, sys; sys.argv = ['maskrcnn-launch', 'validate']\n"
    code += "try:\n    runpy.run_module('maskrcnn_launcher', run_name='__main__')\nexcept SystemExit as e:\n"
    code += "    assert e.code in (0, None), e.code\nassert 'torch' not in sys.modules\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "ok: three-machines.yaml" in result.stdout


@pytest.mark.slow
def test_launcher_imports_and_explains_without_the_kubernetes_client() -> None:
    """`kubernetes` is an optional extra: every module, subpackages too, imports without it, and `status`
    says what to install."""
    code = textwrap.dedent(
        """
        import pkgutil, sys
        sys.modules["kubernetes"] = None  # import kubernetes -> ImportError, as if not installed
        import maskrcnn_launcher
        for mod in pkgutil.walk_packages(maskrcnn_launcher.__path__, "maskrcnn_launcher."):
            if not mod.name.endswith(".__main__"):
                __import__(mod.name)
        from click.testing import CliRunner
        from maskrcnn_launcher.cli import main
        result = CliRunner().invoke(main, ["status", "--release", "demo"])
        print(result.exit_code, result.output.strip())
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "2 error: the status command needs the kubernetes client: pip install 'maskrcnn-launcher[k8s]'"
    )
