"""Password files in the format ``mosquitto_passwd`` writes, and checking passwords against them.

The format (checked against files written by mosquitto_passwd 2.0.11, against the 2.0.11
broker, and against mosquitto's source: the password file parser of 2.0 and the password
code of its 2.1 development branch):

* One user a line: ``username:hash``. Lines end at ``\\n``; blanks (space, tab, CR, VT, FF)
  around the username and around the hash are ignored, as mosquitto does (so CRLF files
  load). A line that is blank, or whose first non-blank character is ``#``, is skipped.
* The username is everything before the first ``:`` (mosquitto_passwd refuses a ``:`` in a
  username): UTF-8, not empty, at most 65,535 bytes, no U+0000. A username appears once.
* ``$6$<salt>$<hash>``: one round of SHA-512 over the password bytes followed by the salt
  bytes, ``sha512(password + salt)`` (``mosquitto_passwd -H sha512``; the only type of
  mosquitto 1.6 and earlier).
* ``$7$<iterations>$<salt>$<hash>``: PBKDF2-HMAC-SHA512 of the password with the salt and
  that many iterations, a 64-byte key (mosquitto_passwd's default since 2.0, which writes
  101 iterations; mosquitto 2.1 writes 1000).
* Salt and hash are standard base64 with ``=`` padding. The salt is 12 bytes (what
  mosquitto 2.0 writes) or 64 bytes (what 2.1 writes), the hash 64 bytes: mosquitto refuses
  other lengths, and so does this module. Iterations are ASCII digits, 1 to 2**31 - 1.
* Not supported (the file is refused): ``$argon2id$`` hashes (mosquitto 2.1 built with
  libargon2) and plain-text passwords (``mosquitto_passwd -U`` converts those).

The contract:

* :meth:`PasswordFile.from_file` reads the file (the only I/O here) and
  :meth:`PasswordFile.parse` its text. An unreadable file raises :class:`PasswordFileError`
  naming the file; the first bad line raises it naming the file and the 1-based line
  number (``path`` and ``line`` attributes; the message never quotes the line, which holds
  a hash). mosquitto logs and skips such lines; here the whole file is refused.
* :meth:`PasswordFile.check` returns True only for a username in the file and the password
  whose hash is stored for it. The password is ``str`` (checked as UTF-8) or ``bytes`` (as
  sent in an MQTT CONNECT, used as is). An empty password is always refused, even when
  the file holds a hash of the empty password (``mosquitto_passwd -b`` writes one; the
  mosquitto 2.0.11 broker refuses it too). A password holding a NUL byte is refused: no
  file written by mosquitto_passwd can hold one; the mosquitto broker stops at the first
  NUL (it accepts ``b"pw\\0x"`` for ``b"pw"``), and PBKDF2's HMAC pads its key with
  zeros, so ``b"pw\\0"`` would otherwise pass for ``b"pw"`` against a ``$7$`` hash.
  Digests are compared with :func:`hmac.compare_digest`. An unknown username is
  hashed against a dummy entry as costly as the costliest entry of the file, so the time
  taken does not tell whether a username exists. ``check`` never raises for str or bytes
  input (anything else is refused).
* :meth:`PasswordHash.create` and :meth:`PasswordFile.to_text` write the same format, for
  tools and tests; ``PasswordFile.parse(f.to_text())`` gives back the same entries.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from router.errors import PasswordFileError

__all__ = [
    "DEFAULT_ITERATIONS",
    "HashType",
    "PasswordFile",
    "PasswordFileError",
    "PasswordHash",
]

DEFAULT_ITERATIONS = 101
"""PBKDF2 iterations :meth:`PasswordHash.create` uses unless told (mosquitto_passwd 2.0's)."""
MAX_ITERATIONS = 2**31 - 1
"""The most PBKDF2 iterations a hash may ask for (mosquitto stores them in a C int)."""
SALT_LENGTHS = (12, 64)
"""The salt lengths mosquitto accepts, in bytes (2.0 writes 12, 2.1 writes 64)."""
DIGEST_LENGTH = 64
"""The length of every hash, in bytes (a SHA-512 digest, and the PBKDF2 key length)."""
MAX_USERNAME_BYTES = 65_535
"""The longest username, in UTF-8 bytes (an MQTT string; mosquitto skips longer ones)."""

_BLANKS = " \t\r\v\f"  # C isspace() without the newline that ends a line
_DIGITS = re.compile(r"[0-9]{1,10}")


class HashType(enum.Enum):
    """A hash type of the file; the value is the tag between the first two ``$``."""

    SHA512 = "6"
    """``$6$``: ``sha512(password + salt)``, one round (``mosquitto_passwd -H sha512``)."""
    SHA512_PBKDF2 = "7"
    """``$7$``: PBKDF2-HMAC-SHA512 (``-H sha512-pbkdf2``, the default since mosquitto 2.0)."""


@dataclass(frozen=True, slots=True)
class PasswordHash:
    """One stored hash: its type, salt, digest and (PBKDF2 only) iteration count.

    Checks itself on creation: :class:`PasswordFileError` (no path, no line) for a salt
    or digest of the wrong length, or iterations that are missing, out of range or given
    to a ``$6$`` hash. Salt and digest stay out of ``repr``.
    """

    hash_type: HashType
    salt: bytes = field(repr=False)
    digest: bytes = field(repr=False)
    iterations: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.hash_type, HashType):
            raise PasswordFileError(f"hash_type must be a HashType, not {self.hash_type!r}")
        if not isinstance(self.salt, bytes) or len(self.salt) not in SALT_LENGTHS:
            raise PasswordFileError("the salt must be 12 or 64 bytes")
        if not isinstance(self.digest, bytes) or len(self.digest) != DIGEST_LENGTH:
            raise PasswordFileError(f"the hash must be {DIGEST_LENGTH} bytes")
        if self.hash_type is HashType.SHA512:
            if self.iterations is not None:
                raise PasswordFileError("a $6$ (sha512) hash has no iteration count")
        elif type(self.iterations) is not int or not 1 <= self.iterations <= MAX_ITERATIONS:
            raise PasswordFileError(
                f"the iteration count must be an int from 1 to {MAX_ITERATIONS}"
            )

    @classmethod
    def parse(cls, encoded: str) -> PasswordHash:
        """The hash written as ``$6$salt$hash`` or ``$7$iterations$salt$hash``.

        Raises :class:`PasswordFileError` (no path, no line) saying what is wrong.
        """
        if not encoded:
            raise PasswordFileError("the hash is missing after 'username:'")
        if not encoded.startswith("$"):
            raise PasswordFileError(
                "the hash does not start with '$' (a plain-text password? "
                "mosquitto_passwd -U hashes those)"
            )
        fields = encoded.split("$")  # ["", tag, ...]
        tag = fields[1]
        iterations: int | None = None
        if tag == HashType.SHA512.value:
            hash_type, iterations, rest = HashType.SHA512, None, fields[2:]
            shape = "$6$<salt>$<hash>"
        elif tag == HashType.SHA512_PBKDF2.value:
            hash_type, rest = HashType.SHA512_PBKDF2, fields[3:]
            shape = "$7$<iterations>$<salt>$<hash>"
            iterations = _iterations(fields[2]) if len(fields) > 2 else None
        else:
            shown = tag if len(tag) <= 16 else tag[:13] + "..."
            raise PasswordFileError(
                f"unknown hash type ${shown}$ (supported: $6$ sha512, $7$ sha512-pbkdf2)"
            )
        if len(rest) != 2 or (iterations is None and hash_type is HashType.SHA512_PBKDF2):
            raise PasswordFileError(f"a ${tag}$ hash has the form {shape}")
        salt = _base64(rest[0], "salt")
        digest = _base64(rest[1], "hash")
        if len(salt) not in SALT_LENGTHS:
            raise PasswordFileError(f"the salt is {len(salt)} bytes; mosquitto uses 12 or 64")
        if len(digest) != DIGEST_LENGTH:
            raise PasswordFileError(f"the hash is {len(digest)} bytes, not {DIGEST_LENGTH}")
        return cls(hash_type, salt, digest, iterations)

    @classmethod
    def create(
        cls,
        password: str | bytes,
        hash_type: HashType = HashType.SHA512_PBKDF2,
        *,
        iterations: int = DEFAULT_ITERATIONS,
        salt: bytes | None = None,
    ) -> PasswordHash:
        """A new hash of ``password`` (a random 12-byte salt unless one is given).

        ``iterations`` is ignored for ``$6$``. Raises :class:`PasswordFileError` for an
        empty password or one holding a NUL byte (it could never be checked) or for bad
        parameters.
        """
        secret = _password_bytes(password)
        if secret is None or not _usable(secret):
            raise PasswordFileError("the password must be a non-empty str or bytes without NUL")
        salt = secrets.token_bytes(SALT_LENGTHS[0]) if salt is None else salt
        rounds = None if hash_type is HashType.SHA512 else iterations
        # The placeholder digest lets __post_init__ check the parameters before hashing.
        template = cls(hash_type, salt, bytes(DIGEST_LENGTH), rounds)
        return cls(hash_type, salt, template._digest_of(secret), rounds)

    def encode(self) -> str:
        """The hash as a password file holds it (what :meth:`parse` reads)."""
        salt = base64.b64encode(self.salt).decode("ascii")
        digest = base64.b64encode(self.digest).decode("ascii")
        if self.hash_type is HashType.SHA512:
            return f"$6${salt}${digest}"
        return f"$7${self.iterations}${salt}${digest}"

    def verify(self, password: str | bytes) -> bool:
        """True if ``password`` hashes to this hash (constant-time comparison).

        An empty password, one holding a NUL byte, a str that is not valid Unicode (a lone
        surrogate) or anything but str or bytes is refused, after hashing all the same.
        """
        secret = _password_bytes(password)
        matched = hmac.compare_digest(self._digest_of(secret or b""), self.digest)
        return _usable(secret) and matched

    @property
    def cost(self) -> int:
        """The hashing rounds one check takes (1 for ``$6$``), to compare hashes."""
        return 1 if self.iterations is None else self.iterations

    def _digest_of(self, secret: bytes) -> bytes:
        if self.iterations is None:
            return hashlib.sha512(secret + self.salt).digest()
        return hashlib.pbkdf2_hmac("sha512", secret, self.salt, self.iterations, DIGEST_LENGTH)


class PasswordFile:
    """The users of a password file and their hashes, in file order; checks passwords.

    ``entries`` maps usernames to :class:`PasswordHash` values (or is (username, hash)
    pairs). Raises :class:`PasswordFileError` for a username the file format cannot hold
    (empty, with ``:``, a newline or U+0000, with blanks around it, starting with ``#``,
    over 65,535 UTF-8 bytes), a username given twice, or a value that is not a hash.
    """

    def __init__(self, entries: Mapping[str, PasswordHash] | Iterable[tuple[str, PasswordHash]]):
        pairs = entries.items() if isinstance(entries, Mapping) else entries
        table: dict[str, PasswordHash] = {}
        for username, stored in pairs:
            _check_username(username)
            if ":" in username or "\n" in username or username != username.strip(_BLANKS):
                raise PasswordFileError(
                    "a username cannot hold ':' or a newline, nor start or end with a blank"
                )
            if username in table:
                raise PasswordFileError(f"the username {username!r} appears twice")
            if not isinstance(stored, PasswordHash):
                raise PasswordFileError(
                    f"a password file holds PasswordHash values, not {stored!r}"
                )
            table[username] = stored
        self._entries = table
        costliest = max(table.values(), key=lambda entry: entry.cost, default=None)
        # Unknown usernames are hashed against this, so they take as long as the costliest
        # user: a zero digest no password produces, and a bare $6$ file stays cheap.
        self._dummy = PasswordHash(
            HashType.SHA512_PBKDF2 if costliest is None else costliest.hash_type,
            bytes(SALT_LENGTHS[0]),
            bytes(DIGEST_LENGTH),
            DEFAULT_ITERATIONS if costliest is None else costliest.iterations,
        )

    @classmethod
    def parse(cls, text: str | bytes, path: str = "<passwords>") -> PasswordFile:
        """The users in ``text`` (the file format; bytes are decoded as UTF-8 line by line).

        Raises :class:`PasswordFileError` naming ``path`` and the 1-based number of the
        first bad line.
        """
        lines: Iterable[str | bytes] = (
            text.split(b"\n") if isinstance(text, bytes) else text.split("\n")
        )
        table: dict[str, PasswordHash] = {}
        for number, raw in enumerate(lines, start=1):
            try:
                line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
                entry = _parse_line(line)
                if entry is not None and entry[0] in table:
                    raise PasswordFileError(f"the username {entry[0]!r} appears twice")
            except UnicodeDecodeError:
                raise PasswordFileError("the line is not UTF-8", path, number) from None
            except PasswordFileError as error:
                raise PasswordFileError(error.reason, path, number) from None
            if entry is not None:
                table[entry[0]] = entry[1]
        return cls(table)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> PasswordFile:
        """The users of the password file at ``path`` (see :meth:`parse`).

        Raises :class:`PasswordFileError` naming the file if it cannot be read, and the
        file and line for a bad line.
        """
        try:
            data = Path(path).read_bytes()
        except OSError as error:
            reason = error.strerror or type(error).__name__
            raise PasswordFileError(
                f"cannot read the password file: {reason}", os.fspath(path)
            ) from error
        return cls.parse(data, os.fspath(path))

    def check(self, username: str, password: str | bytes) -> bool:
        """True only if ``username`` is in the file and ``password`` is its password.

        Unknown usernames and empty passwords are refused after the same hashing work as
        a known user (see the module's contract); never raises for str or bytes input.
        """
        stored = self._entries.get(username) if isinstance(username, str) else None
        matched = (self._dummy if stored is None else stored).verify(password)
        return stored is not None and matched

    @property
    def entries(self) -> Mapping[str, PasswordHash]:
        """Username to hash, in file order (read-only)."""
        return MappingProxyType(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, username: object) -> bool:
        return isinstance(username, str) and username in self._entries

    def __repr__(self) -> str:
        return f"PasswordFile({len(self._entries)} users)"

    def to_text(self) -> str:
        """The file text: one ``username:hash`` line per user, in order (what mosquitto
        and :meth:`parse` read)."""
        return "".join(f"{name}:{stored.encode()}\n" for name, stored in self._entries.items())


# -- parsing helpers -----------------------------------------------------------------------


def _parse_line(line: str) -> tuple[str, PasswordHash] | None:
    """The (username, hash) of one line, None for a blank or comment line."""
    stripped = line.strip(_BLANKS)
    if not stripped or stripped.startswith("#"):
        return None
    username, colon, encoded = stripped.partition(":")
    if not colon:
        raise PasswordFileError("expected 'username:hash', found no ':'")
    username = username.strip(_BLANKS)
    _check_username(username)
    return username, PasswordHash.parse(encoded.strip(_BLANKS))


def _check_username(username: object) -> None:
    if not isinstance(username, str) or not username:
        raise PasswordFileError("the username is empty or not a str")
    if "\0" in username:
        raise PasswordFileError("the username holds U+0000")
    if username.startswith("#"):
        raise PasswordFileError("a username cannot start with '#' (it reads as a comment)")
    try:
        size = len(username.encode("utf-8"))
    except UnicodeEncodeError:
        raise PasswordFileError("the username is not valid Unicode") from None
    if size > MAX_USERNAME_BYTES:
        raise PasswordFileError(f"the username is over {MAX_USERNAME_BYTES} bytes")


def _iterations(text: str) -> int:
    if _DIGITS.fullmatch(text) is None or not 1 <= int(text) <= MAX_ITERATIONS:
        shown = text if len(text) <= 16 else text[:13] + "..."
        raise PasswordFileError(
            f"bad iteration count {shown!r}: expected 1 to {MAX_ITERATIONS} in ASCII digits"
        )
    return int(text)


def _base64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (UnicodeEncodeError, ValueError):  # binascii.Error is a ValueError
        raise PasswordFileError(f"the {what} is not valid base64") from None


def _usable(secret: bytes | None) -> bool:
    """Whether a password may match at all: not empty, no NUL byte (see the contract)."""
    return secret is not None and len(secret) > 0 and b"\0" not in secret


def _password_bytes(password: object) -> bytes | None:
    """The password as bytes; None for a str that is not valid Unicode or another type."""
    if isinstance(password, str):
        try:
            return password.encode("utf-8")
        except UnicodeEncodeError:
            return None
    if isinstance(password, bytes | bytearray | memoryview):
        return bytes(password)
    return None
