"""Profile files: finding them (shipped, the user's directory, a path), parsing and checking them, writing them.

The one reader (``parse_profile``) and the one writer (``host_profile_text``) of the format; which table a file
must have, and which class builds it, comes from the kind registry in ``base``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from cptsim.errors import InputError
from .base import _KIND_CLASSES, _NAME_RE, Field, HardwareProfile, _Checker, kinds


# ----------------------------------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------------------------------


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(float(f"{v:.6g}"))
    return json.dumps(str(v))  # a JSON string (ASCII, escaped) is a valid TOML basic string


def host_profile_text(name: str, description: str, sources: list[str], params: dict, calibration: dict,
                      header: list[str] = (), comments: dict | None = None) -> str:
    """The text of a ``host`` profile file: the one writer of the format that ``load_profile`` reads.

    ``header``: comment lines for the top; ``comments``: a trailing comment per [host] key. The text is checked by
    parsing it back before it is returned, so a writer can never leave a profile that will not load.
    """
    comments = comments or {}
    lines = [*(f"# {h}" for h in header),
             f"name = {_toml_value(name)}", 'kind = "host"', f"description = {_toml_value(description)}",
             "sources = [" + ", ".join(_toml_value(x) for x in sources) + "]", "", "[host]"]
    for k, v in params.items():
        lines.append(f"{k} = {_toml_value(v)}" + (f"  # {comments[k]}" if k in comments else ""))
    lines += ["", "[calibration]", *(f"{k} = {_toml_value(v)}" for k, v in calibration.items()), ""]
    text = "\n".join(lines)
    parse_profile(text.encode("utf-8"), f"{name}.toml")
    return text


def recalibrated_profile_text(base_text: str, name: str, description: str, source: str, calibration: dict,
                              header: list[str] = ()) -> str:
    """The text of a profile of any kind that is ``base_text`` (a profile file's text) with its name, description,
    one more source, and these ``[calibration]`` values; every other line -- the base's numbers, tiers and comments
    -- kept as it is, its ``[validation]`` dropped (what the base was checked on says nothing of the new values).
    Parsed back before it is returned, like ``host_profile_text``."""
    lines = base_text.splitlines()
    out, section, done = [*(f"# {h}" for h in header)], None, set()
    for line in lines:
        head = re.match(r"\s*\[([A-Za-z0-9_.]+)\]\s*(#.*)?$", line)
        if head:
            if section == "calibration":
                out += [f"{k} = {_toml_value(float(v))}" for k, v in calibration.items() if k not in done]
            section = head.group(1)
            if section == "validation":
                continue
        if section == "validation":
            continue
        key = re.match(r"\s*([A-Za-z0-9_]+)\s*=", line)
        if section is None and key and key.group(1) == "name":
            line = f"name = {_toml_value(name)}"
        elif section is None and key and key.group(1) == "description":
            line = f"description = {_toml_value(description)}"
        elif section is None and key and key.group(1) == "sources":
            out.append(line)
            line = f"    {_toml_value(source)}," if line.rstrip().endswith("[") else None
            if line is None:  # a one-line list: put the new source first
                out[-1] = re.sub(r"=\s*\[", "= [" + _toml_value(source) + ", ", out[-1], count=1)
                continue
        elif section == "calibration" and key and key.group(1) in calibration:
            line = f"{key.group(1)} = {_toml_value(float(calibration[key.group(1)]))}"
            done.add(key.group(1))
        out.append(line)
    if section == "calibration":
        out += [f"{k} = {_toml_value(float(v))}" for k, v in calibration.items() if k not in done]
    elif "calibration" not in {m.group(1) for m in (re.match(r"\s*\[([A-Za-z0-9_.]+)\]", x) for x in lines) if m}:
        out += ["", "[calibration]", *(f"{k} = {_toml_value(float(v))}" for k, v in calibration.items())]
    text = "\n".join(out) + "\n"
    parse_profile(text.encode("utf-8"), f"{name}.toml")
    return text


# ----------------------------------------------------------------------------------------------------------------------
# Finding and loading files
# ----------------------------------------------------------------------------------------------------------------------


def user_profile_dir() -> Path:
    """Where the user's own profiles live (``cptsim hw calibrate`` writes host.toml there).

    ``$CPTSIM_HOME/hw_profiles`` if CPTSIM_HOME is set, else ``$XDG_CONFIG_HOME/cptsim/hw_profiles``
    (``~/.config/cptsim/hw_profiles``).
    """
    home = os.environ.get("CPTSIM_HOME")
    if home:
        return Path(home).expanduser() / "hw_profiles"
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config).expanduser() / "cptsim" / "hw_profiles"


def _shipped() -> dict[str, Any]:
    root = resources.files("cptsim.hw_profiles")
    return {p.name[:-5]: p for p in root.iterdir() if p.name.endswith(".toml")}


def _user() -> dict[str, Path]:
    d = user_profile_dir()
    if not d.is_dir():
        return {}
    return {p.stem: p for p in d.glob("*.toml") if p.is_file()}


def list_profiles() -> list[str]:
    """Names ``load_profile`` accepts: the shipped profiles plus the user's (e.g. a calibrated host), sorted."""
    return sorted(set(_shipped()) | set(_user()))


def profile_origin(name: str) -> str:
    """"user" when ``load_profile(name)`` reads the user's directory, else "shipped"."""
    return "user" if name in _user() else "shipped"


def _looks_like_path(s: str) -> bool:
    return s.endswith(".toml") or "/" in s or os.sep in s or (os.altsep is not None and os.altsep in s)


def load_profile(name_or_path: str) -> HardwareProfile:
    """A profile by name (the user's directory first, then the shipped ones) or by path to a .toml file.

    Raises InputError naming the file, the key and what was expected for anything wrong with it.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise InputError(f"hardware profile must be a name or a path, got {name_or_path!r}")
    s = os.fspath(name_or_path)
    if not s.strip():
        raise InputError(f"hardware profile name is empty (valid: {', '.join(list_profiles())})")
    if isinstance(name_or_path, os.PathLike) or _looks_like_path(s) or Path(s).is_file():
        p = Path(s).expanduser()
        if not p.is_file():
            raise InputError(f"hardware profile file not found: {s}")
        try:
            data = p.read_bytes()
        except OSError as e:
            raise InputError(f"cannot read hardware profile {s}: {e.strerror}") from None
        return parse_profile(data, label=s, path=str(p.resolve()))
    user = _user()
    if s in user:
        p = user[s]
        return parse_profile(p.read_bytes(), label=str(p), path=str(p), expect_name=s)
    shipped = _shipped()
    if s in shipped:
        res = shipped[s]
        return parse_profile(res.read_bytes(), label=res.name, path=str(res), expect_name=s)
    raise InputError(f"unknown hardware profile {s!r} (valid: {', '.join(list_profiles())}; or a path to a .toml file)")


def load_profiles(names: list[str], flag: str = "--hw") -> list[HardwareProfile]:
    """The profiles of a list (``flag``'s names and .toml paths, in order), each loaded by ``load_profile``. Two that
    carry the same profile name are an InputError naming both sources: a command shows and records its rows by
    that name, so two rows called ``bitfusion`` could not be told apart."""
    profiles = [load_profile(n) for n in names]
    seen: dict[str, tuple[str, HardwareProfile]] = {}
    for given, prof in zip(names, profiles):
        if prof.name in seen:
            first, other = seen[prof.name]
            where = (f"{first} ({other.path})" if first.strip() != other.path else first,
                     f"{given} ({prof.path})" if given.strip() != prof.path else given)
            if other.path == prof.path:
                raise InputError(f"{flag} names profile {prof.name!r} twice: {where[0]} and {where[1]}; give it once")
            raise InputError(f"{flag} has two profiles named {prof.name!r}: {where[0]} and {where[1]}; give one, or "
                             "rename the other (its name = ... line)")
        seen[prof.name] = (given.strip(), prof)
    return profiles


_TOP = (
    Field("name", "string", "the profile's name: letters, digits, '.', '_', '-'"),
    Field("kind", "string", "the profile's kind, which says which table holds its numbers"),
    Field("description", "string", "one line saying which machine this is"),
    Field("sources", "list", "citations: where the numbers come from"),
)
_TOML_POS = re.compile(r"^(?P<msg>.*) \(at line (?P<line>\d+), column (?P<col>\d+)\)$")


def parse_profile(data: bytes, label: str, path: str = "", expect_name: str | None = None) -> HardwareProfile:
    """Validate and build a profile from a TOML file's bytes; ``label`` names the file in error messages."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{label}: not UTF-8 text (a TOML file was expected)") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = _TOML_POS.match(str(e))
        where = f"{label}:{m['line']}:{m['col']}" if m else label
        raise InputError(f"{where}: invalid TOML: {m['msg'] if m else e}") from None
    chk = _Checker(label)

    # The kind first: it says which table the file must have, so it decides what counts as an unknown key.
    if "kind" not in doc:
        chk.fail(f"missing key 'kind' (one of {', '.join(kinds())})")
    kind = doc["kind"]
    if not isinstance(kind, str) or kind not in _KIND_CLASSES:
        chk.fail(f"kind must be one of {', '.join(kinds())}, got {kind!r}")
    head = chk.fields(doc, _TOP, "", nested=(kind, "calibration", "validation"))
    if not _NAME_RE.match(head["name"]):
        chk.fail(f"name must be letters, digits, '.', '_' or '-', got {head['name']!r}")
    if expect_name is not None and head["name"] != expect_name:
        chk.fail(f"name {head['name']!r} must match the file name {expect_name!r}")
    sources = head["sources"]
    if not (isinstance(sources, list) and sources and all(isinstance(x, str) and x.strip() for x in sources)):
        chk.fail(f"sources must be a non-empty list of non-empty strings (citations), got {sources!r}")

    cls = _KIND_CLASSES[kind]
    params = cls.parse_params(chk, chk.table(doc, kind, f"the numbers of a {kind} profile"))
    cal_table = doc.get("calibration", {})
    if not isinstance(cal_table, dict):
        chk.fail(f"calibration must be a table [calibration], got {cal_table!r}")
    calibration = chk.fields(cal_table, cls.CALIBRATION, "calibration")
    val_table = doc.get("validation", {})
    if not isinstance(val_table, dict):
        chk.fail(f"validation must be a table [validation], got {val_table!r}")
    validation = chk.fields(val_table, _VALIDATION, "validation") if val_table else {}
    if validation and not all(isinstance(m, str) for m in validation["op_mixes"]):
        chk.fail(f"validation.op_mixes must be a list of names ({', '.join(OP_MIXES)}), got {validation['op_mixes']!r}")

    return cls(
        name=head["name"], kind=kind, description=head["description"], sources=list(sources), path=path,
        content_hash=hashlib.sha256(data).hexdigest()[:16], params=params, calibration=calibration,
        validation=validation,
    )


# What a profile's time model was checked against: the file's [validation] table, which cost, plan and report
# print beside every time they give (how sure the number is). Errors are |predicted / measured - 1|.
OP_MIXES = ("conv", "depthwise", "grouped", "attention", "linear", "lstm", "graph")
_VALIDATION = (
    Field("against", "string", "what the times were checked on (published or measured; which networks)"),
    Field("n", "positive", "how many measurements"),
    Field("median_abs_error", "nonneg", "median |predicted / measured - 1| over them"),
    Field("worst_abs_error", "nonneg", "the largest |predicted / measured - 1| over them"),
    Field("held_out", "string", '"yes" when the check is on measurements the constants were not fitted to, '
          '"no" when in-sample'),
    Field("op_mixes", "list", f"the kinds of network the set covers ({', '.join(OP_MIXES)})"),
)
