"""`fairgate admin ...`: tenants, keys, weights, quotas and usage through the Admin service.

Every command takes `--target` and `--admin-key` (default: $FAIRGATE_ADMIN_KEY) and prints its
result as JSON. Quota flags (`--tokens-per-minute`, ...) are generated from the fields of
`tenants.TenantQuota`, one per quota setting; only the flags given change anything, and the help
of `tenant create` states the default each one left out takes (the server's `TenantQuota()`).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TypeAlias, cast

from fairgate import AdminClient, QuotaFields
from fairgate.v1 import admin_pb2 as admin_pb
from gateway.cli_common import (
    CommandIncomplete,
    Handler,
    add_target,
    credential,
    print_json,
    reporting_errors,
    wire_flag,
)
from tenants import TenantQuota

QUOTA_DEFAULTS = TenantQuota()
QUOTA_TYPES: dict[str, type] = {
    f.name: type(getattr(QUOTA_DEFAULTS, f.name)) for f in dataclasses.fields(TenantQuota)
}
QUOTA_HELP = {
    "weight": "fair-share weight, 0.001 to 1000",
    "tokens_per_minute": "token bucket rate over prompt + output tokens; 0: no limit",
    "max_concurrent_calls": "calls running at once; 0: no limit",
    "max_queued_jobs": "admitted, unfinished jobs; 0: no limit",
    "max_nodes_per_job": "nodes of one job; 0: no limit",
    "max_prompt_tokens": "tokens of one rendered prompt; 0: no limit",
    "max_tokens_ceiling": "the most tokens any call may generate",
    "default_max_tokens": "max_tokens of calls that set none",
    "daily_token_budget": "prompt + output tokens per UTC day; 0: no limit",
    "max_streams": "open WatchJob, RunJob and Generate streams; 0: no limit",
}
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def register_admin(subparsers: Subparsers) -> None:
    admin = subparsers.add_parser("admin", help="manage tenants, keys and quotas")
    kinds = admin.add_subparsers(dest="admin_command", required=True)
    tenant = _group(kinds, "tenant", "create, get, list, update or delete tenants")
    _command(tenant, "create", tenant_create, "create a tenant", "tenant", "name", "new quota")
    _command(tenant, "get", tenant_get, "show a tenant, its quota and keys", "tenant")
    listing = _command(tenant, "list", tenant_list, "list every tenant")
    page_size = admin_pb.ListTenantsRequest.DESCRIPTOR.fields_by_name["page_size"]
    listing.add_argument(
        "--page-size", type=wire_flag(page_size, least=0), default=0, help="tenants per request"
    )
    _command(
        tenant,
        "update",
        tenant_update,
        "rename a tenant or change its quota",
        "tenant",
        "name",
        "quota",
    )
    _command(tenant, "delete", tenant_delete, "delete a tenant and its keys", "tenant")
    key = _group(kinds, "key", "issue or revoke API keys")
    issue = _command(key, "issue", key_issue, "issue a key (its secret is shown once)", "tenant")
    issue.add_argument("--label", default="", help="free text to tell keys apart")
    revoke = _command(key, "revoke", key_revoke, "revoke a key", "tenant")
    revoke.add_argument("key_id")
    weight = _group(kinds, "weight", "set a tenant's fair-share weight")
    setting = _command(weight, "set", weight_set, "set the fair-share weight", "tenant")
    setting.add_argument(
        "weight", type=float, help="0.001 to 1000; twice the weight, twice the share"
    )
    quota = _group(kinds, "quota", "set a tenant's quota settings")
    _command(quota, "set", quota_set, "change the quota settings given", "tenant", "quota")
    _command(kinds, "usage", usage_get, "show a tenant's usage", "tenant")


def _group(kinds: Subparsers, name: str, help_text: str) -> Subparsers:
    parser = kinds.add_parser(name, help=help_text)
    return parser.add_subparsers(dest=f"{name}_command", required=True)


def _command(
    actions: Subparsers, name: str, handler: Handler, help_text: str, *parts: str
) -> argparse.ArgumentParser:
    """A subcommand running `handler`, with the positional tenant and flags named in parts."""
    parser = actions.add_parser(name, help=help_text, description=help_text)
    if "tenant" in parts:
        parser.add_argument("tenant", help="tenant id")
    if "name" in parts:
        parser.add_argument("--name", help="display name")
    if "quota" in parts or "new quota" in parts:
        _add_quota_flags(parser, with_defaults="new quota" in parts)
    add_target(parser)
    parser.add_argument("--admin-key", help="the admin key (default: $FAIRGATE_ADMIN_KEY)")
    parser.set_defaults(func=handler)
    return parser


def _add_quota_flags(parser: argparse.ArgumentParser, *, with_defaults: bool) -> None:
    """One flag per quota setting; on create the help names the default a flag left out takes,
    elsewhere a flag left out keeps the tenant's value."""
    for field, kind in QUOTA_TYPES.items():
        left_out = f"default: {getattr(QUOTA_DEFAULTS, field)}" if with_defaults else "unchanged"
        help_text = f"{QUOTA_HELP[field]} ({left_out})"
        flag = f"--{field.replace('_', '-')}"
        parser.add_argument(
            flag,
            dest=field,
            type=wire_flag(admin_pb.TenantQuota.DESCRIPTOR.fields_by_name[field], kind),
            help=help_text,
        )


def _client(args: argparse.Namespace) -> AdminClient:
    return AdminClient(args.target, credential(args.admin_key, "FAIRGATE_ADMIN_KEY", "--admin-key"))


def _quota(args: argparse.Namespace) -> QuotaFields:
    given = {f: getattr(args, f) for f in QUOTA_TYPES if getattr(args, f) is not None}
    return cast(QuotaFields, given)


@reporting_errors
async def tenant_create(args: argparse.Namespace) -> int:
    async with _client(args) as admin:
        print_json(await admin.create_tenant(args.tenant, args.name or "", **_quota(args)))
    return 0


@reporting_errors
async def tenant_get(args: argparse.Namespace) -> int:
    async with _client(args) as admin:
        print_json(await admin.get_tenant(args.tenant))
    return 0


@reporting_errors
async def tenant_list(args: argparse.Namespace) -> int:
    async with _client(args) as admin:
        print_json([tenant async for tenant in admin.list_tenants(args.page_size)])
    return 0


@reporting_errors
async def tenant_update(args: argparse.Namespace) -> int:
    async with _client(args) as admin:
        tenant = await admin.update_tenant(args.tenant, display_name=args.name, **_quota(args))
        print_json(tenant)
    return 0


@reporting_errors
async def tenant_delete(args: argparse.Namespace) -> int:
    async with _client(args) as admin:
        await admin.delete_tenant(args.tenant)
    print(f"deleted {args.tenant}")
    return 0


@reporting_errors
async def key_issue(args: argparse.Namespace) -> int:
    async with _client(args) as admin:
        print_json(await admin.issue_key(args.tenant, args.label))
    return 0


@reporting_errors
async def key_revoke(args: argparse.Namespace) -> int:
    async with _client(args) as admin:
        await admin.revoke_key(args.tenant, args.key_id)
    print(f"revoked {args.key_id}")
    return 0


@reporting_errors
async def weight_set(args: argparse.Namespace) -> int:
    async with _client(args) as admin:
        print_json(await admin.set_weight(args.tenant, args.weight))
    return 0


@reporting_errors
async def quota_set(args: argparse.Namespace) -> int:
    fields = _quota(args)
    if not fields:
        raise CommandIncomplete("give at least one quota flag, e.g. --tokens-per-minute")
    async with _client(args) as admin:
        print_json(await admin.set_quota(args.tenant, **fields))
    return 0


@reporting_errors
async def usage_get(args: argparse.Namespace) -> int:
    async with _client(args) as admin:
        print_json(await admin.get_usage(args.tenant))
    return 0
