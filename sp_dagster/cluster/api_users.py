"""Users and roles of the manager API: passwords kept only as salted scrypt hashes, HTTP Basic credentials checked in constant time.
Roles rank `viewer` < `deployer` < `admin` (docs/operations/security.md); a refusal is an `ApiRefused`
with the HTTP status (401 or 403) and one line.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass

from sp_dagster.config.model import API_ROLES

VIEWER, DEPLOYER, ADMIN = API_ROLES
_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}


class ApiRefused(Exception):
    """A request the API refuses: `status` (HTTP) and a one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Caller:
    """An authenticated user: its name and role."""

    username: str
    role: str

    def require(self, role: str, action: str) -> None:
        """ApiRefused (403, naming the role needed) unless this user's role is `role` or above."""
        if API_ROLES.index(self.role) < API_ROLES.index(role):
            raise ApiRefused(403, f"user '{self.username}' has role '{self.role}'; {action} needs role '{role}' or above")


def _hash(password: str, salt: bytes) -> bytes:
    return hashlib.scrypt(password.encode("utf-8"), salt=salt, **_SCRYPT)


class Users:
    """The API's users, from deployment.config.api.users (each password salted and hashed; the text is not kept)."""

    def __init__(self, users) -> None:
        self._users: dict[str, tuple[bytes, bytes, str]] = {}
        for user in users:
            salt = os.urandom(16)
            self._users[user.username] = (salt, _hash(user.password, salt), user.role)
        self._dummy_salt = os.urandom(16)
        self._dummy = _hash(os.urandom(8).hex(), self._dummy_salt)

    def __len__(self) -> int:
        return len(self._users)

    def check(self, username: str, password: str) -> Caller | None:
        """The user when the password is its own, else None (an unknown name costs as much as a wrong password)."""
        salt, digest, role = self._users.get(username, (self._dummy_salt, self._dummy, ""))
        matches = hmac.compare_digest(_hash(password, salt), digest)
        return Caller(username, role) if matches and role else None

    def authenticate(self, authorization: str | None) -> Caller:
        """The user an `Authorization: Basic ...` header names; ApiRefused (401) for none, a malformed one or a wrong password."""
        scheme, _, encoded = (authorization or "").partition(" ")
        if scheme.lower() != "basic" or not encoded:
            raise ApiRefused(401, "the manager API needs a user: pass --user NAME and export SP_DAGSTER_PASSWORD")
        try:
            username, found, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            found, username, password = "", "", ""
        user = self.check(username, password) if found else None
        if user is None:
            raise ApiRefused(401, "wrong user name or password for the manager API")
        return user


def basic_authorization(username: str, password: str) -> str:
    """The `Authorization` header value of HTTP Basic credentials."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
