"""Check the wheels and sdists `nox -s packaging` built against the pyproject.toml they came from.

    python tests/packaging/check_dists.py check DIST PROJECT_DIR...
    python tests/packaging/check_dists.py deps DIST EXTRA   # what `tito-core[EXTRA]` needs besides tito wheels

`check`: every project has exactly one wheel and one sdist in DIST, whose metadata carry its name, version,
requirements (extras included), entry points and README; tito-core's extras pin the sibling packages at their
versions (the adapters, and tito-testing for `testing`); tito-testing's wheel and sdist hold the chat templates
and tito-core's hold no test support (no `testing/` folder, no `.jinja` file). `deps` prints, one a line, the
requirements of tito-core and of the adapter behind EXTRA that are not tito packages, for installing from the
index before the tito wheels go in with `--no-index`.
"""

from __future__ import annotations

import configparser
import email.parser
import email.policy
import sys
import tarfile
import tomllib
import zipfile
from email.message import Message
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

# tito-core extra -> the sibling package it must pin, when that package is in the tree.
SIBLING_EXTRAS = {
    "vllm": "tito-vllm",
    "sglang": "tito-sglang",
    "transformers": "tito-transformers",
    "testing": "tito-testing",
}
# Package data tito-testing must ship (the offline tokenizers' chat templates), besides every file under
# src/tito_testing/templates/ in the tree.
TESTING_DATA = [
    "tito_testing/templates/SOURCES.md",
    "tito_testing/templates/trl/LICENSE",
    "tito_testing/templates/trl/qwen3.jinja",
    "tito_testing/templates/trl/qwen3_training.jinja",
    "tito_testing/templates/trl/qwen2_5.jinja",
    "tito_testing/templates/trl/gemma4.jinja",
]


def _key(req: Requirement) -> tuple[str, str, str, str]:
    return (canonicalize_name(req.name), ",".join(sorted(req.extras)), str(req.specifier), str(req.marker or ""))


def _parse(text: str) -> Message:
    return email.parser.Parser(policy=email.policy.compat32).parsestr(text)


def _name_version(name: str, version: Version) -> tuple[str, str]:
    return canonicalize_name(name), str(version)


def _find(dist: Path, name: str, version: str) -> tuple[Path, Path]:
    wheels = [p for p in dist.glob("*.whl") if _name_version(*parse_wheel_filename(p.name)[:2]) == (name, version)]
    sdists = [p for p in dist.glob("*.tar.gz") if _name_version(*parse_sdist_filename(p.name)) == (name, version)]
    if len(wheels) != 1 or len(sdists) != 1:
        raise SystemExit(f"{name} {version}: expected one wheel and one sdist in {dist}, got {wheels} {sdists}")
    return wheels[0], sdists[0]


def _in_extra(requirement: str, extra: str) -> Requirement:
    """``requirement`` as a wheel lists it under ``extra``: its marker and-ed with ``extra == "..."``."""
    req = Requirement(requirement)
    condition = f'extra == "{extra}"'
    marker = f"({req.marker}) and {condition}" if req.marker else condition
    req.marker = None
    return Requirement(f"{req}; {marker}")


def _expected_requirements(project: dict) -> set[tuple[str, str, str, str]]:
    expected = {_key(Requirement(r)) for r in project.get("dependencies", [])}
    for extra, reqs in project.get("optional-dependencies", {}).items():
        expected |= {_key(_in_extra(r, extra)) for r in reqs}
    return expected


def _testing_data(project_dir: Path) -> list[str]:
    """The chat templates and their sources/licenses tito-testing must ship, as paths under ``src/``."""
    src = project_dir / "src"
    in_tree = {p.relative_to(src).as_posix() for p in (src / "tito_testing" / "templates").rglob("*") if p.is_file()}
    return sorted(in_tree | set(TESTING_DATA))


def _is_test_support(path: str) -> bool:
    """A wheel or sdist member that belongs in tito-testing, not tito-core: ``tito_core/testing/``, a template."""
    return "tito_core/testing/" in path or path.endswith(".jinja")


def check_project(dist: Path, project_dir: Path, versions: dict[str, str]) -> list[str]:
    """Return the problems of one project's wheel and sdist (empty when all is well)."""
    pyproject = tomllib.loads((project_dir / "pyproject.toml").read_text(encoding="utf-8"))
    project = pyproject["project"]
    name, version = canonicalize_name(project["name"]), project["version"]
    wheel, sdist = _find(dist, name, version)
    problems: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = f"{project['name'].replace('-', '_')}-{version}.dist-info"
        meta = _parse(zf.read(f"{info}/METADATA").decode("utf-8"))
        entry_points = configparser.ConfigParser(delimiters=("=",))
        entry_points.optionxform = str  # type: ignore[assignment,method-assign]  # keep the names' case
        if f"{info}/entry_points.txt" in names:
            entry_points.read_string(zf.read(f"{info}/entry_points.txt").decode("utf-8"))
    if (meta["Name"], meta["Version"]) != (project["name"], version):
        problems.append(f"{wheel.name}: Name/Version {meta['Name']} {meta['Version']}")
    got = {_key(Requirement(r)) for r in meta.get_all("Requires-Dist") or []}
    expected = _expected_requirements(project)
    if got != expected:
        problems.append(f"{wheel.name}: Requires-Dist differs: missing {expected - got}, unexpected {got - expected}")
    extras = set(meta.get_all("Provides-Extra") or [])
    if extras != set(project.get("optional-dependencies", {})):
        problems.append(f"{wheel.name}: Provides-Extra {sorted(extras)}")
    for group, points in project.get("entry-points", {}).items():
        shipped = dict(entry_points[group]) if entry_points.has_section(group) else {}
        if shipped != points:
            problems.append(f"{wheel.name}: entry points [{group}] {shipped} != {points}")
    if meta["Requires-Python"] != project["requires-python"]:
        problems.append(f"{wheel.name}: Requires-Python {meta['Requires-Python']}")
    if not (meta.get_payload() or "").strip():
        problems.append(f"{wheel.name}: no long description (README)")
    if name == "tito-testing":
        problems += [f"{wheel.name}: lacks {path}" for path in _testing_data(project_dir) if path not in names]
    if name == "tito-core":
        problems += [f"{wheel.name}: ships test support {n}" for n in names if _is_test_support(n)]
        pins = {
            canonicalize_name(Requirement(r).name): str(Requirement(r).specifier)
            for extra in SIBLING_EXTRAS
            for r in project.get("optional-dependencies", {}).get(extra, [])
        }
        for extra, sibling in SIBLING_EXTRAS.items():
            if extra not in project.get("optional-dependencies", {}):
                problems.append(f"tito-core has no [{extra}] extra")
            elif sibling in versions and pins.get(sibling) != f"=={versions[sibling]}":
                pin = f"{sibling}{pins.get(sibling, ' (nothing)')}"
                problems.append(f"tito-core[{extra}] pins {pin}, but the tree has {sibling} {versions[sibling]}")
            elif sibling not in versions:
                print(f"note: {sibling} is not in this tree; tito-core[{extra}] is not checked against it")
    with tarfile.open(sdist) as tf:
        top = f"{sdist.name.removesuffix('.tar.gz')}"
        members = set(tf.getnames())
        pkg_info = tf.extractfile(f"{top}/PKG-INFO")
        sdist_meta = _parse(pkg_info.read().decode("utf-8")) if pkg_info else Message()
    if (sdist_meta["Name"], sdist_meta["Version"]) != (project["name"], version):
        problems.append(f"{sdist.name}: PKG-INFO Name/Version {sdist_meta['Name']} {sdist_meta['Version']}")
    if f"{top}/pyproject.toml" not in members:
        problems.append(f"{sdist.name}: no pyproject.toml")
    if name == "tito-testing":
        problems += [f"{sdist.name}: lacks {p}" for p in _testing_data(project_dir) if f"{top}/src/{p}" not in members]
    if name == "tito-core":
        problems += [f"{sdist.name}: ships test support {m}" for m in members if _is_test_support(m)]
    print(f"ok  {wheel.name}  {sdist.name}" if not problems else f"BAD {wheel.name}")
    return problems


def check(dist: Path, project_dirs: list[Path]) -> None:
    """Check every project; exit non-zero listing all problems."""
    versions = {}
    for d in project_dirs:
        project = tomllib.loads((d / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        versions[canonicalize_name(project["name"])] = project["version"]
    problems = [p for d in project_dirs for p in check_project(dist, d, versions)]
    if problems:
        raise SystemExit("metadata problems:\n  " + "\n  ".join(problems))


def dependencies(dist: Path, extra: str) -> list[str]:
    """Non-tito requirements of tito-core (base) and of the adapter behind ``extra``, from the built wheels."""
    out: list[str] = []
    for wheel in sorted(dist.glob("*.whl")):
        name = parse_wheel_filename(wheel.name)[0]
        if name not in ("tito-core", SIBLING_EXTRAS[extra]):
            continue
        with zipfile.ZipFile(wheel) as zf:
            (meta_path,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
            meta = _parse(zf.read(meta_path).decode("utf-8"))
        for r in meta.get_all("Requires-Dist") or []:
            req = Requirement(r)
            if "extra" in str(req.marker or "") or canonicalize_name(req.name).startswith("tito-"):
                continue
            out.append(str(req))
    return out


def main(argv: list[str]) -> None:
    """Command line: ``check DIST PROJECT_DIR...`` or ``deps DIST EXTRA``."""
    match argv:
        case ["check", dist, *projects] if projects:
            check(Path(dist), [Path(p) for p in projects])
        case ["deps", dist, extra]:
            print("\n".join(dependencies(Path(dist), extra)))
        case _:
            raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
