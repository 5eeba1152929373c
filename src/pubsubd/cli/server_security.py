"""The security flags of the processes clients call (``serve``, ``forwarder``, ``frontend``),
declared once: TLS (``--tls-*``), authentication (``--auth-*``), IAM (``--iam``,
``--iam-policy-file``, ``--trust-caller-header``) and, for forwarders, the cluster's internal
token (``--internal-token-file``, ``core/internal_token.py``). Every process of a cluster also
takes the ZooKeeper flags (:func:`zookeeper_tls_options`: ``--zk-tls-ca``, ``--zk-tls-cert``,
``--zk-tls-key``, which set ``core.tls.ZOOKEEPER``, and ``--zk-auth-file``, which sets
``coordination.credentials.ZOOKEEPER_CREDENTIAL``) before the command runs; a process that
ZooKeeper refuses (NoAuth) ends with that error, naming the flag.

:func:`security_options` adds the flags to a typer command, which receives them as one
:class:`SecurityFlags` in its ``security`` parameter; :meth:`SecurityFlags.apply` puts them on a
``ServerConfig`` and configures the process's internal clients (TLS, token), raising ValueError
with the reason when a file or a combination is bad.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast

import typer

from pubsubd import config as config_mod

__all__ = [
    "NO_FLAGS",
    "SecurityFlags",
    "configure_zookeeper_tls",
    "internal_tls",
    "security_options",
    "server_tls",
    "zookeeper_tls_options",
]

F = TypeVar("F", bound=Callable[..., Any])

TlsCert = Annotated[
    Path | None,
    typer.Option(envvar="PUBSUBD_TLS_CERT", help="TLS on every port: the certificate (PEM)"),
]
TlsKey = Annotated[
    Path | None, typer.Option(envvar="PUBSUBD_TLS_KEY", help="the certificate's key (PEM)")
]
TlsClientCa = Annotated[
    Path | None,
    typer.Option(
        envvar="PUBSUBD_TLS_CLIENT_CA", help="mutual TLS: the CA client certificates chain to"
    ),
]
TlsCa = Annotated[
    Path | None,
    typer.Option(
        envvar="PUBSUBD_TLS_CA",
        help="a cluster speaking TLS: the CA this process's clients of the others trust",
    ),
]
AuthSecretFile = Annotated[
    Path | None,
    typer.Option(
        envvar="PUBSUBD_AUTH_SECRET_FILE", help="authentication: HS256 JWTs signed with this"
    ),
]
AuthPublicKey = Annotated[
    Path | None,
    typer.Option(
        envvar="PUBSUBD_AUTH_PUBLIC_KEY", help="authentication: RS256 JWTs (PEM public key)"
    ),
]
AuthTokensFile = Annotated[
    Path | None,
    typer.Option(
        envvar="PUBSUBD_AUTH_TOKENS_FILE", help="authentication: static 'TOKEN SUBJECT' lines"
    ),
]
AuthAudience = Annotated[
    str | None, typer.Option(envvar="PUBSUBD_AUTH_AUDIENCE", help="JWTs must carry this aud")
]
AuthIssuer = Annotated[
    str | None, typer.Option(envvar="PUBSUBD_AUTH_ISSUER", help="JWTs must carry this iss")
]
Iam = Annotated[
    bool | None,
    typer.Option(
        "--iam/--no-iam", help="authorize every call with IAM policies (PUBSUBD_IAM; default off)"
    ),
]
IamPolicyFile = Annotated[
    Path | None,
    typer.Option(help="JSON project-level IAM policies for admins (PUBSUBD_IAM_POLICY_FILE)"),
]
TrustCallerHeader = Annotated[
    bool | None,
    typer.Option(
        "--trust-caller-header",
        help="TESTS/DEV ONLY: believe the x-pubsubd-caller header as the caller's identity",
    ),
]
InternalTokenFile = Annotated[
    Path | None,
    typer.Option(
        envvar="PUBSUBD_INTERNAL_TOKEN_FILE",
        help="the bearer token (a file) this process's own calls to other forwarders and to "
        "storage nodes carry; needed with --auth-* (forwarders) and with storage nodes that "
        "check tokens; its subject passes IAM (a cluster secret)",
    ),
]

InternalTokenGrace = Annotated[
    float | None,
    typer.Option(
        envvar="PUBSUBD_INTERNAL_TOKEN_GRACE",
        min=0.0,
        help="after the internal token file names another subject, the one before stays "
        "accepted this long, s (rotation across machines; default 60; 0 = none)",
    ),
]

# A storage node's reading of the same file: whose calls it takes, not what it sends.
NodeInternalTokenFile = Annotated[
    Path | None,
    typer.Option(
        "--internal-token-file",
        envvar="PUBSUBD_INTERNAL_TOKEN_FILE",
        help="the cluster's internal token (a file, the writers' --internal-token-file): with "
        "--auth-* (where it is required) only its subject may call this node",
    ),
]

ZkTlsCa = Annotated[
    Path | None,
    typer.Option(
        envvar="PUBSUBD_ZK_TLS_CA",
        help="TLS to ZooKeeper (its secureClientPort), trusting this CA (PEM)",
    ),
]
ZkTlsCert = Annotated[
    Path | None,
    typer.Option(
        envvar="PUBSUBD_ZK_TLS_CERT",
        help="the client certificate shown to ZooKeeper (PEM; mutual TLS)",
    ),
]
ZkTlsKey = Annotated[
    Path | None,
    typer.Option(envvar="PUBSUBD_ZK_TLS_KEY", help="its key (PEM)"),
]
ZkAuthFile = Annotated[
    Path | None,
    typer.Option(
        envvar="PUBSUBD_ZK_AUTH_FILE",
        help="the cluster's ZooKeeper credential, a file holding user:password (digest "
        "authentication; every znode created is this identity's only)",
    ),
]

_KW = inspect.Parameter.KEYWORD_ONLY
_ZK_FLAGS = tuple(
    inspect.Parameter(name, _KW, default=None, annotation=annotation)
    for name, annotation in (
        ("zk_tls_ca", ZkTlsCa),
        ("zk_tls_cert", ZkTlsCert),
        ("zk_tls_key", ZkTlsKey),
        ("zk_auth_file", ZkAuthFile),
    )
)
_FLAGS = tuple(
    inspect.Parameter(name, _KW, default=None, annotation=annotation)
    for name, annotation in (
        ("tls_cert", TlsCert),
        ("tls_key", TlsKey),
        ("tls_client_ca", TlsClientCa),
        ("tls_ca", TlsCa),
        ("auth_secret_file", AuthSecretFile),
        ("auth_public_key", AuthPublicKey),
        ("auth_tokens_file", AuthTokensFile),
        ("auth_audience", AuthAudience),
        ("auth_issuer", AuthIssuer),
        ("iam", Iam),
        ("iam_policy_file", IamPolicyFile),
        ("trust_caller_header", TrustCallerHeader),
        ("internal_token_file", InternalTokenFile),
        ("internal_token_grace", InternalTokenGrace),
    )
)


@dataclass(frozen=True)
class SecurityFlags:
    """The security flags as given (None: not given)."""

    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    tls_ca: Path | None = None
    auth_secret_file: Path | None = None
    auth_public_key: Path | None = None
    auth_tokens_file: Path | None = None
    auth_audience: str | None = None
    auth_issuer: str | None = None
    iam: bool | None = None
    iam_policy_file: Path | None = None
    trust_caller_header: bool | None = None
    internal_token_file: Path | None = None
    internal_token_grace: float | None = None

    def apply(
        self, cfg: config_mod.ServerConfig, *, forwarder: bool = False
    ) -> config_mod.ServerConfig:
        """``cfg`` (from the environment) with these flags over it; configures the process's
        internal clients (``--tls-ca``, ``--internal-token-file``). ValueError: what is wrong.
        ``forwarder``: authentication needs an internal token that this process accepts."""
        from pubsubd.control.policies import PolicyFileError, load_policy_file
        from pubsubd.core.internal_token import INTERNAL_TOKEN, internal_principal

        cfg = replace(
            cfg,
            iam=self.iam if self.iam is not None else cfg.iam,
            iam_policy_file=self.iam_policy_file or cfg.iam_policy_file,
            trust_caller_header=bool(self.trust_caller_header) or cfg.trust_caller_header,
            internal_token_file=self.internal_token_file or cfg.internal_token_file,
            internal_token_grace_s=(
                self.internal_token_grace
                if self.internal_token_grace is not None
                else cfg.internal_token_grace_s
            ),
        )
        try:
            load_policy_file(cfg.iam_policy_file)
        except PolicyFileError as e:
            raise ValueError(str(e)) from None
        cfg = config_mod.with_security(
            cfg,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
            tls_client_ca=self.tls_client_ca,
            auth_secret_file=self.auth_secret_file,
            auth_public_key=self.auth_public_key,
            auth_tokens_file=self.auth_tokens_file,
            auth_audience=self.auth_audience,
            auth_issuer=self.auth_issuer,
        )
        if cfg.tokens is not None and cfg.trust_caller_header:
            raise ValueError(
                "--trust-caller-header (tests and development only) would let any caller "
                "name itself: it cannot be used with authentication"
            )
        if forwarder and cfg.tokens is not None and cfg.internal_token_file is None:
            raise ValueError(
                "a forwarder with authentication needs --internal-token-file: the token its "
                "own calls to other forwarders carry (dead letters, reads of copies)"
            )
        if cfg.internal_token_file is not None:
            INTERNAL_TOKEN.configure(cfg.internal_token_file)
            if cfg.tokens is not None:
                from pubsubd.core.tokens import TokenVerifier

                internal_principal(TokenVerifier(cfg.tokens), cfg.internal_token_file)
        internal_tls(self.tls_ca, self.tls_cert, self.tls_key)
        return cfg


NO_FLAGS = SecurityFlags()  # a command's default: the decorator always passes the flags given


def server_tls(cert: Path | None, key: Path | None, client_ca: Path | None) -> Any:
    """A cluster process's listeners' TLS (core.tls.ServerTls), None when off."""
    if cert is None and key is None and client_ca is None:
        return None
    if cert is None or key is None:
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    from pubsubd.core.tls import ServerTls

    return ServerTls(cert, key, client_ca).check()


def internal_tls(ca: Path | None, cert: Path | None, key: Path | None) -> None:
    """With ``--tls-ca``, this process's clients of the cluster's other processes speak TLS,
    trusting that CA and showing the process's own certificate (for mutual TLS)."""
    if ca is not None:
        from pubsubd.core.tls import INTERNAL, ClientTls

        INTERNAL.configure(ClientTls(ca, cert, key))


def _with_flags(
    command: F,
    flags: tuple[inspect.Parameter, ...],
    run: Callable[..., Any],
    *,
    replaces: str | None = None,
) -> F:
    """``command`` with ``flags`` added to the signature typer reads (``replaces``: the one
    parameter of its own they stand for); a call runs ``run(given, *args, **kwargs)`` with the
    flags' values by name and the command's own arguments."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != replaces]

    @functools.wraps(command)
    def with_flags(*args: Any, **kwargs: Any) -> Any:
        given = {p.name: kwargs.pop(p.name, None) for p in flags}
        return run(given, *args, **kwargs)

    parameters = [*own, *flags]
    with_flags.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    with_flags.__annotations__ = {p.name: p.annotation for p in parameters}
    return cast(F, with_flags)


# The flags of each part a command may leave out (security_options); the rest always come.
_TLS_CA = frozenset({"tls_ca"})
_AUTH = frozenset(
    {"auth_secret_file", "auth_public_key", "auth_tokens_file", "auth_audience", "auth_issuer"}
)
_IAM = frozenset({"iam", "iam_policy_file", "trust_caller_header"})
_INTERNAL_TOKEN = frozenset({"internal_token_file", "internal_token_grace"})


def security_options(
    *,
    internal_token: bool = False,
    tls_ca: bool = True,
    auth: bool = True,
    iam: bool = True,
) -> Callable[[F], F]:
    """Add the security flags to a command whose ``security`` parameter receives them (a
    :class:`SecurityFlags`; a flag left out stays None): the listeners' ``--tls-cert``,
    ``--tls-key``, ``--tls-client-ca`` always; ``tls_ca``: ``--tls-ca`` (its clients of the
    cluster's other processes); ``auth``: ``--auth-*``; ``iam``: ``--iam``,
    ``--iam-policy-file``, ``--trust-caller-header``; ``internal_token``:
    ``--internal-token-file``."""
    left_out = (
        (frozenset() if internal_token else _INTERNAL_TOKEN)
        | (frozenset() if tls_ca else _TLS_CA)
        | (frozenset() if auth else _AUTH)
        | (frozenset() if iam else _IAM)
    )

    def decorate(command: F) -> F:
        flags = tuple(p for p in _FLAGS if p.name not in left_out)

        def run(given: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            return command(*args, security=SecurityFlags(**given), **kwargs)

        return _with_flags(command, flags, run, replaces="security")

    return decorate


def configure_zookeeper_tls(ca: Path | None, cert: Path | None, key: Path | None) -> None:
    """Set the process's ZooKeeper TLS (``core.tls.ZOOKEEPER``): on with ``ca``; ``cert`` and
    ``key`` (both or neither) for a ZooKeeper that asks for client certificates. ValueError
    names what is wrong."""
    from pubsubd.core.tls import ZOOKEEPER, ClientTls

    if ca is None and cert is None and key is None:
        return
    if ca is None:
        raise ValueError("--zk-tls-cert and --zk-tls-key need --zk-tls-ca (TLS to ZooKeeper)")
    if (cert is None) != (key is None):
        raise ValueError("--zk-tls-cert and --zk-tls-key go together")
    ZOOKEEPER.configure(ClientTls(ca, cert, key))


def zookeeper_tls_options(command: F) -> F:
    """Add ``--zk-tls-ca``, ``--zk-tls-cert``, ``--zk-tls-key`` and ``--zk-auth-file`` to a
    command; they configure the process's ZooKeeper TLS and credential before it runs (a bad
    file is a usage error). If ZooKeeper refuses the process (NoAuth, however the command
    wraps it), it ends with that error and status 1."""

    def run(given: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        from pubsubd.coordination.credentials import ZOOKEEPER_CREDENTIAL

        try:
            configure_zookeeper_tls(given["zk_tls_ca"], given["zk_tls_cert"], given["zk_tls_key"])
            ZOOKEEPER_CREDENTIAL.configure(given["zk_auth_file"])
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        try:
            return command(*args, **kwargs)
        except typer.Exit:
            raise  # the command said why itself
        except Exception as e:
            from pubsubd.coordination.errors import access_denied

            denied = access_denied(e)
            if denied is None:
                raise
            sys.stderr.write(f"error: {denied}\n")
            raise typer.Exit(1) from None

    return _with_flags(command, _ZK_FLAGS, run)
