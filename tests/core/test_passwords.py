"""Password files: files written by the real mosquitto_passwd, bad lines, round trips.

mosquitto_passwd comes from the Debian package ``mosquitto``, which `make test` installs;
the tests fail (never skip) without it. The files are written with ``-b`` (batch mode) in
a temporary directory, with both hash types: ``-H sha512`` (``$6$``) and the default
``-H sha512-pbkdf2`` (``$7$``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from router.core.passwords import (
    DEFAULT_ITERATIONS,
    HashType,
    PasswordFile,
    PasswordFileError,
    PasswordHash,
)
from router.errors import RouterError

# username -> (password, hash type option of mosquitto_passwd or None for its default)
USERS: dict[str, tuple[str, str | None]] = {
    "alice": ("correct horse", None),
    "bob": ("hunter2", "sha512"),
    "carol": ("pässwörd ✓ 🔑", "sha512-pbkdf2"),
    "dave": ("", None),
    "erin": ("", "sha512"),
    "frank": ("has:colon $dollar and spaces ", "sha512"),
    " spaced ": ("x y", None),
}
WITH_PASSWORD = {name: pw for name, (pw, _) in USERS.items() if pw and name == name.strip()}


def run_mosquitto_passwd(*args: str) -> None:
    tool = shutil.which("mosquitto_passwd")
    assert tool is not None, "mosquitto_passwd is missing: install the Debian package mosquitto"
    subprocess.run([tool, *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def real_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("passwords") / "passwd"
    for number, (name, (password, hash_type)) in enumerate(USERS.items()):
        create = ["-c"] if number == 0 else []
        option = ["-H", hash_type] if hash_type else []
        run_mosquitto_passwd(*option, *create, "-b", str(path), name, password)
    return path


@pytest.fixture(scope="module")
def passwords(real_file: Path) -> PasswordFile:
    return PasswordFile.from_file(real_file)


# -- files written by mosquitto_passwd -----------------------------------------------------


def test_the_tool_wrote_both_hash_types(real_file: Path) -> None:
    lines = real_file.read_text(encoding="utf-8").splitlines()
    kinds = {line.split(":", 1)[0]: line.split(":", 1)[1][:3] for line in lines}
    assert kinds == {
        "alice": "$7$",
        "bob": "$6$",
        "carol": "$7$",
        "dave": "$7$",
        "erin": "$6$",
        "frank": "$6$",
        " spaced ": "$7$",
    }
    assert lines[0].startswith(f"alice:$7${DEFAULT_ITERATIONS}$")


def test_every_entry_is_loaded(passwords: PasswordFile) -> None:
    assert list(passwords.entries) == ["alice", "bob", "carol", "dave", "erin", "frank", "spaced"]
    assert len(passwords) == 7
    assert passwords.entries["alice"].hash_type is HashType.SHA512_PBKDF2
    assert passwords.entries["alice"].iterations == DEFAULT_ITERATIONS
    assert passwords.entries["bob"].hash_type is HashType.SHA512
    assert passwords.entries["bob"].iterations is None
    assert all(len(entry.salt) == 12 for entry in passwords.entries.values())


@pytest.mark.parametrize("name", sorted(WITH_PASSWORD))
def test_the_right_password_is_accepted(passwords: PasswordFile, name: str) -> None:
    password = WITH_PASSWORD[name]
    assert passwords.check(name, password)
    assert passwords.check(name, password.encode("utf-8"))
    assert passwords.check(name, bytearray(password.encode("utf-8")))


def test_blanks_around_a_username_are_dropped_as_mosquitto_does(passwords: PasswordFile) -> None:
    assert passwords.check("spaced", "x y")
    assert not passwords.check(" spaced ", "x y")


@pytest.mark.parametrize("name", sorted(WITH_PASSWORD))
def test_wrong_passwords_are_refused(passwords: PasswordFile, name: str) -> None:
    password = WITH_PASSWORD[name]
    wrong = [
        password + " ",
        password[:-1],
        password.upper(),
        " " + password,
        password + "\0",
        password.encode("utf-8") + b"\0",
        password.encode("utf-16-le"),
        "\udcff",  # a lone surrogate: not a str that can be sent
        *(other for other in WITH_PASSWORD.values() if other != password),
    ]
    for attempt in wrong:
        assert not passwords.check(name, attempt), attempt


@pytest.mark.parametrize("name", ["", "mallory", "Alice", "alice ", "#alice", "alice\0"])
def test_unknown_users_are_refused(passwords: PasswordFile, name: str) -> None:
    for password in [*WITH_PASSWORD.values(), "", "anything"]:
        assert not passwords.check(name, password)


@pytest.mark.parametrize("name", sorted(USERS.keys() - {" spaced "} | {"spaced"}))
def test_empty_passwords_are_refused(passwords: PasswordFile, name: str) -> None:
    assert not passwords.check(name, "")
    assert not passwords.check(name, b"")


def test_an_empty_password_is_refused_even_where_the_file_holds_its_hash(
    passwords: PasswordFile,
) -> None:
    # mosquitto_passwd -b hashed "" for dave ($7$) and erin ($6$): the hashes are right...
    dave, erin = passwords.entries["dave"], passwords.entries["erin"]
    assert dave.iterations is not None
    assert dave.digest == hashlib.pbkdf2_hmac("sha512", b"", dave.salt, dave.iterations, 64)
    assert erin.digest == hashlib.sha512(erin.salt).digest()
    # ... and refused all the same (the mosquitto 2.0.11 broker refuses them too).
    assert not passwords.check("dave", "")
    assert not passwords.check("erin", b"")
    assert not dave.verify("")


def test_the_constructions_are_the_ones_mosquitto_uses(passwords: PasswordFile) -> None:
    """$6$ is sha512(password + salt); $7$ is PBKDF2-HMAC-SHA512 with a 64-byte key."""
    bob, alice = passwords.entries["bob"], passwords.entries["alice"]
    assert bob.digest == hashlib.sha512(b"hunter2" + bob.salt).digest()
    assert alice.digest == hashlib.pbkdf2_hmac(
        "sha512", b"correct horse", alice.salt, DEFAULT_ITERATIONS, 64
    )
    assert bob.digest != hashlib.sha512(bob.salt + b"hunter2").digest()


def test_odd_arguments_are_refused_without_raising(passwords: PasswordFile) -> None:
    nothing: Any = None
    number: Any = 12345
    assert not passwords.check("alice", nothing)
    assert not passwords.check(nothing, "correct horse")
    assert not passwords.check("alice", number)
    assert not passwords.check(number, "correct horse")
    assert nothing not in passwords
    assert [] not in passwords  # unhashable: no TypeError
    assert "alice" in passwords
    assert "mallory" not in passwords


def test_the_file_is_written_back_as_the_tool_wrote_it(real_file: Path) -> None:
    text = real_file.read_text(encoding="utf-8")
    again = PasswordFile.parse(text).to_text()
    assert again == text.replace(" spaced :", "spaced:")


def test_crlf_comments_and_blank_lines_are_accepted(real_file: Path, tmp_path: Path) -> None:
    body = real_file.read_text(encoding="utf-8")
    text = "# written by mosquitto_passwd\n\n   \n\t# indented comment\n" + body
    path = tmp_path / "crlf"
    path.write_bytes(text.replace("\n", "\r\n").encode("utf-8"))
    loaded = PasswordFile.from_file(path)
    assert loaded.entries == PasswordFile.parse(body).entries
    assert loaded.check("carol", "pässwörd ✓ 🔑")


def test_a_user_deleted_by_the_tool_is_gone(real_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "copy"
    shutil.copyfile(real_file, path)
    run_mosquitto_passwd("-D", str(path), "alice")
    run_mosquitto_passwd("-H", "sha512", "-b", str(path), "bob", "a new one")
    loaded = PasswordFile.from_file(path)
    assert "alice" not in loaded
    assert not loaded.check("alice", "correct horse")
    assert not loaded.check("bob", "hunter2")
    assert loaded.check("bob", "a new one")


# -- what a check costs --------------------------------------------------------------------


def spy_on(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []
    real: Callable[..., Any] = getattr(module, name)

    def spy(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(module, name, spy)
    return calls


def test_an_unknown_user_costs_as_much_as_the_costliest_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    file = PasswordFile(
        {
            "cheap": PasswordHash.create("a", iterations=3),
            "dear": PasswordHash.create("b", iterations=40),
            "old": PasswordHash.create("c", HashType.SHA512),
        }
    )
    pbkdf2 = spy_on(monkeypatch, hashlib, "pbkdf2_hmac")
    compared = spy_on(monkeypatch, hmac, "compare_digest")
    assert not file.check("nobody", "b")
    assert [call[3] for call in pbkdf2] == [40]
    assert len(compared) == 1
    assert not file.check("dear", "")  # an empty password is hashed too
    assert [call[3] for call in pbkdf2] == [40, 40]
    assert len(compared) == 2


def test_an_unknown_user_of_a_sha512_file_costs_one_sha512(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    file = PasswordFile({"old": PasswordHash.create("c", HashType.SHA512)})
    pbkdf2 = spy_on(monkeypatch, hashlib, "pbkdf2_hmac")
    sha512 = spy_on(monkeypatch, hashlib, "sha512")
    assert not file.check("nobody", "c")
    assert pbkdf2 == []
    assert len(sha512) == 1


# -- bad files -----------------------------------------------------------------------------

SALT = base64.b64encode(bytes(range(12))).decode()
HASH = base64.b64encode(bytes(range(64))).decode()
GOOD_7 = f"$7$101${SALT}${HASH}"
GOOD_6 = f"$6${SALT}${HASH}"

BAD_LINES = {
    "no colon": "alice",
    "no colon, a hash": f"alice {GOOD_7}",
    "no hash": "alice:",
    "no username": f":{GOOD_7}",
    "a blank username": f"  :{GOOD_7}",
    "NUL in the username": f"al\0ice:{GOOD_7}",
    "a plain-text password": "alice:secret",
    "unknown type $5$": f"alice:$5${SALT}${HASH}",
    "unknown type $1$": f"alice:$1${SALT}${HASH}",
    "unknown type $argon2id$": f"alice:$argon2id$v=19$m=47104,t=1,p=1${SALT}${HASH}",
    "unknown type $$": f"alice:$${SALT}${HASH}",
    "only a $": "alice:$",
    "$7 alone": "alice:$7",
    "$6$ with iterations": f"alice:$6$101${SALT}${HASH}",
    "$7$ without iterations": f"alice:$7${SALT}${HASH}",
    "$7$ with an extra field": f"alice:{GOOD_7}$x",
    "$6$ without a hash": f"alice:$6${SALT}",
    "$6$ with an empty salt": f"alice:$6$${HASH}",
    "bad base64 salt": f"alice:$7$101$!!!!{SALT[4:]}${HASH}",
    "bad base64 hash": f"alice:$7$101${SALT}${HASH[:-4]}@@==",
    "unpadded base64 hash": f"alice:$6${SALT}${HASH.rstrip('=')}",
    "non-ASCII base64": f"alice:$6${SALT[:-1]}é${HASH}",
    "a blank inside the hash": f"alice:$6${SALT} ${HASH}",
    "a short salt": f"alice:$6$AAAA${HASH}",
    "a 16-byte salt": f"alice:$6${base64.b64encode(bytes(16)).decode()}${HASH}",
    "a short hash": f"alice:$6${SALT}${base64.b64encode(bytes(32)).decode()}",
    "iterations 0": f"alice:$7$0${SALT}${HASH}",
    "iterations -5": f"alice:$7$-5${SALT}${HASH}",
    "iterations +5": f"alice:$7$+5${SALT}${HASH}",
    "iterations abc": f"alice:$7$abc${SALT}${HASH}",
    "iterations empty": f"alice:$7$${SALT}${HASH}",
    "iterations 1e3": f"alice:$7$1e3${SALT}${HASH}",
    "iterations 1_000": f"alice:$7$1_000${SALT}${HASH}",
    "iterations in Arabic digits": f"alice:$7$١٠١${SALT}${HASH}",
    "iterations 2**31": f"alice:$7${2**31}${SALT}${HASH}",
    "iterations of 5000 digits": f"alice:$7${'9' * 5000}${SALT}${HASH}",
    "a second bob": f"bob:{GOOD_7}",
    "a second bob, blanks around": f" bob :{GOOD_7}",
}


@pytest.mark.parametrize("line", BAD_LINES.values(), ids=BAD_LINES.keys())
def test_a_bad_line_is_refused_with_its_number(tmp_path: Path, line: str) -> None:
    path = tmp_path / "passwd"
    path.write_text(f"# users\n\nbob:{GOOD_6}\n{line}\ncarol:{GOOD_7}\n", encoding="utf-8")
    number = 4
    with pytest.raises(PasswordFileError) as caught:
        PasswordFile.from_file(path)
    error = caught.value
    assert isinstance(error, RouterError)
    assert isinstance(error, ValueError)
    assert (error.path, error.line) == (str(path), number)
    assert str(error).startswith(f"{path}:{number}: ")
    assert error.reason in str(error)
    assert HASH not in str(error)  # the message does not quote the hash
    with pytest.raises(PasswordFileError) as again:
        PasswordFile.parse(path.read_text(encoding="utf-8"), "users.txt")
    assert (again.value.path, again.value.line) == ("users.txt", number)


def test_the_first_bad_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    path.write_text(f"bob:{GOOD_6}\nalice\nmallory:$9$\n", encoding="utf-8")
    with pytest.raises(PasswordFileError) as caught:
        PasswordFile.from_file(path)
    assert caught.value.line == 2


def test_a_line_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    path.write_bytes(f"bob:{GOOD_6}\n".encode() + b"\xffalice:" + GOOD_7.encode() + b"\n")
    with pytest.raises(PasswordFileError) as caught:
        PasswordFile.from_file(path)
    assert (caught.value.path, caught.value.line) == (str(path), 2)


def test_the_blank_ends_of_a_line_are_not_the_hash(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    path.write_text(f"  bob  :\t{GOOD_6} \r\n", encoding="utf-8")
    assert list(PasswordFile.from_file(path).entries) == ["bob"]


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_an_unreadable_file_is_refused_with_its_name(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "nothing-here" if kind == "missing" else tmp_path
    with pytest.raises(PasswordFileError) as caught:
        PasswordFile.from_file(path)
    error = caught.value
    assert isinstance(error, RouterError)
    assert isinstance(error, ValueError)
    assert (error.path, error.line) == (str(path), None)
    assert str(error).startswith(f"{path}: cannot read the password file")


def test_an_empty_file_has_no_users(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    path.write_bytes(b"")
    empty = PasswordFile.from_file(path)
    assert len(empty) == 0
    assert not empty.check("alice", "anything")


@pytest.mark.parametrize(
    "name",
    ["", "a:b", "a\nb", " a", "a\t", "#a", "a\0b", "\udcff", "é" * 32_768],
)
def test_usernames_the_format_cannot_hold_are_refused(name: str) -> None:
    with pytest.raises(PasswordFileError):
        PasswordFile({name: PasswordHash.create("x", iterations=1)})


def test_a_username_given_twice_in_code_is_refused() -> None:
    entry = PasswordHash.create("x", iterations=1)
    with pytest.raises(PasswordFileError):
        PasswordFile([("alice", entry), ("alice", entry)])


@pytest.mark.parametrize(
    "arguments",
    [
        {"password": ""},
        {"password": b""},
        {"password": "pw\0"},
        {"password": b"\0pw"},
        {"password": "x", "iterations": 0},
        {"password": "x", "iterations": 2**31},
        {"password": "x", "salt": bytes(11)},
        {"password": "x", "salt": bytes(16)},
    ],
)
def test_bad_hash_parameters_are_refused(arguments: dict[str, Any]) -> None:
    with pytest.raises(PasswordFileError) as caught:
        PasswordHash.create(**arguments)
    assert (caught.value.path, caught.value.line) == (None, None)


def test_a_hash_keeps_its_secrets_out_of_repr() -> None:
    entry = PasswordHash.parse(GOOD_7)
    assert SALT not in repr(entry) and "salt=" not in repr(entry)
    assert entry.encode() == GOOD_7


# -- round trips ---------------------------------------------------------------------------

USERNAMES = st.text(
    alphabet=st.characters(exclude_categories=("Cs",), exclude_characters=":\n\0"),
    min_size=1,
    max_size=12,
).filter(lambda name: name == name.strip(" \t\r\v\f") and not name.startswith("#"))
PASSWORDS = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), min_size=1),
    st.binary(min_size=1, max_size=16).filter(lambda password: b"\0" not in password),
)
SALTS = st.one_of(st.binary(min_size=12, max_size=12), st.binary(min_size=64, max_size=64))
HASHES = st.tuples(
    PASSWORDS, st.sampled_from(HashType), st.integers(min_value=1, max_value=5), SALTS
)


@settings(max_examples=150, deadline=None)
@given(users=st.dictionaries(USERNAMES, HASHES, max_size=5), as_bytes=st.booleans())
def test_a_written_file_reads_back_the_same(
    users: dict[str, tuple[str | bytes, HashType, int, bytes]], as_bytes: bool
) -> None:
    written = PasswordFile(
        {
            name: PasswordHash.create(password, kind, iterations=rounds, salt=salt)
            for name, (password, kind, rounds, salt) in users.items()
        }
    )
    text = written.to_text()
    read = PasswordFile.parse(text.encode("utf-8") if as_bytes else text)
    assert read.entries == written.entries
    assert read.to_text() == text
    for name, (password, _, _, _) in users.items():
        assert read.check(name, password)
        assert not read.check(name, password + (b"!" if isinstance(password, bytes) else "!"))
        assert not read.check(name, "")
        assert not read.check(name + "x", password)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200)))
def test_any_text_loads_or_raises_the_file_error(text: str | bytes) -> None:
    try:
        PasswordFile.parse(text)
    except PasswordFileError as error:
        assert error.path == "<passwords>"
        assert error.line is not None and error.line >= 1


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="$67:0123456789abcAB+/=@ ", max_size=60))
def test_any_hash_shaped_line_loads_or_raises_the_file_error(rest: str) -> None:
    try:
        PasswordFile.parse(f"# head\nalice:{rest}\n")
    except PasswordFileError as error:
        assert error.line == 2
