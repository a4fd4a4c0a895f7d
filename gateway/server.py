"""The running gateway: engine, quota store, policy, dispatcher and the grpc.aio server.

`running_gateway(settings)` is an async context manager that owns everything it starts;
`serve(settings)` runs one until cancelled (Ctrl-C, SIGTERM). Shutdown is graceful: health
turns NOT_SERVING, running RPCs get `settings.grace_s` to end, then calls still running are
cancelled, their engine blocks freed and their quota released, in that order. Health is
NOT_SERVING too while the engine cannot serve (its steps keep failing), or, with remote
backends only, while none of them serves. With a redis store the
gateway is one replica of a deployment (docs/REPLICAS.md): jobs are journaled, and shutdown
hands them over instead of cancelling them: events written, leases handed back (another replica,
or this one started again, takes them over), then the calls running here are aborted and their
quota released. `serve` refuses to start on a non-loopback host with the default admin key,
and serves TLS (or mTLS) when the settings name a certificate.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import signal
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import aio_server_interceptor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine import AsyncEngine, LLMEngine
from engine.heap import freeze_startup_heap
from fairgate.connection import keepalive_options
from fairgate.v1 import admin_pb2, admin_pb2_grpc, gateway_pb2, gateway_pb2_grpc
from gateway.admin_service import AdminService
from gateway.auth import AuthInterceptor, FailureThrottle
from gateway.backends import OpenAIBackend
from gateway.calls import CallDefaults, CallPlanner
from gateway.dispatch import DispatchConfig, Dispatcher
from gateway.errors import JournalUnavailable
from gateway.genai_metrics import GenAiMetrics
from gateway.journal import RedisJournal
from gateway.journaling import Journaling
from gateway.lanes import Lane, make_lane
from gateway.loop_budget import LoopBudget
from gateway.metrics import GatewayMetrics
from gateway.outbox import Outbox
from gateway.pool import Pools, open_pools
from gateway.registry import JobRegistry
from gateway.room_news import RoomNews
from gateway.service import GatewayService
from gateway.settings import DEFAULT_ADMIN_KEY, Settings
from gateway.share import RedisShare
from gateway.status import snapshot
from gateway.streams import OpenStreams
from gateway.telemetry import TRACER_NAME, setup_metrics, setup_tracing, tracer
from predictor.anomaly import AnomalyGuard
from predictor.distribution import LengthDistribution
from predictor.error_tracker import ErrorTracker
from predictor.history import HistoryPredictor
from predictor.prompt_model import HIDDEN_ARTIFACT, PromptModel
from tenants import MemoryQuotaStore, QuotaStore, RedisQuotaStore
from tenants.policies import make_serving_policy

log = logging.getLogger(__name__)
SERVICES = (
    gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
)
# Prior of output lengths before a tenant has history (calls capped at 512 by default).
LENGTH_PRIOR = LengthDistribution(mean=160.0, p50=128.0, p90=320.0, p99=512.0)


@dataclass(slots=True)
class RunningGateway:
    settings: Settings
    port: int
    store: QuotaStore
    engine: AsyncEngine | None  # the local engine, when the pool has one
    dispatcher: Dispatcher
    jobs: JobRegistry
    service: GatewayService
    health: health.aio.HealthServicer
    metrics_port: int | None  # where /metrics is served, when it is
    journaling: Journaling | None  # with a redis store: this replica's side of the journal
    room_news: RoomNews | None  # with a redis store and servers: news of room they freed


class UnsafeSettings(ValueError):
    """Settings that would expose the gateway (the default admin key off loopback...)."""


def check_exposure(settings: Settings) -> None:
    """Refuse the documented default admin key anywhere but on a loopback host."""
    if settings.admin_key == DEFAULT_ADMIN_KEY and not is_loopback(settings.host):
        raise UnsafeSettings(
            f"refusing to serve on {settings.host!r} with the default admin key: set "
            "FAIRGATE_ADMIN_KEY (or admin_key in the config file) to a secret, e.g. the output "
            "of `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )
    named = [settings.tls_cert_file, settings.tls_key_file]
    if any(named) and not all(named):
        raise UnsafeSettings("TLS needs both tls_cert_file and tls_key_file")
    if settings.tls_client_ca_file is not None and settings.tls_cert_file is None:
        raise UnsafeSettings("tls_client_ca_file (mTLS) needs tls_cert_file and tls_key_file")
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        try:  # now, not as the port is bound (after the engine loaded), as "Failed to bind"
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
            if settings.tls_client_ca_file is not None:
                context.load_verify_locations(settings.tls_client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise UnsafeSettings(
                f"TLS: tls_cert_file {settings.tls_cert_file}, tls_key_file "
                f"{settings.tls_key_file} or tls_client_ca_file do not load: {exc}"
            ) from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def outbox_path(settings: Settings) -> Path | None:
    """Where quota closes wait while the store is away; none for the in-memory store."""
    if settings.outbox_file is not None:
        return settings.outbox_file
    if settings.store == "memory":
        return None
    return Path.home() / ".local" / "state" / "fairgate" / f"outbox-{settings.port}.jsonl"


def make_store(settings: Settings) -> QuotaStore:
    if settings.store == "memory":
        return MemoryQuotaStore()
    return RedisQuotaStore(settings.store)  # a URL, as the settings check


def server_options(settings: Settings) -> list[tuple[str, int]]:
    age: list[tuple[str, int]] = []
    if settings.max_connection_age_s is not None:
        age = [
            ("grpc.max_connection_age_ms", int(settings.max_connection_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", int(settings.max_connection_age_grace_s * 1000)),
        ]
    return [
        *age,
        # on by default in gRPC: a second gateway on a port the first serves would bind it too,
        # and the kernel would split the connections between them
        ("grpc.so_reuseport", 0),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        *keepalive_options(settings.keepalive_s, settings.keepalive_timeout_s),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.max_connection_idle_ms", int(settings.max_connection_idle_s * 1000)),
    ]


@contextlib.asynccontextmanager
async def serving_metrics(metrics: GatewayMetrics, host: str, port: int) -> AsyncIterator[int]:
    """Serve the metrics' /metrics over HTTP while the block runs; yields the port."""
    from engine.openai_api.server import listening_socket, running_server  # uvicorn's stack

    async def scrape(request: Request) -> Response:
        headers = request.headers
        body, reply_headers = await metrics.exposition(
            headers.get("accept", ""), headers.get("accept-encoding", "")
        )
        return Response(body, headers=reply_headers)

    app = Starlette(routes=[Route("/metrics", scrape)])
    with listening_socket(host, port) as sock:
        async with running_server(app, sock):
            yield sock.getsockname()[1]


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials from the settings' files; None when TLS is off."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    pair = (settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())
    client_ca = settings.tls_client_ca_file
    return grpc.ssl_server_credentials(
        [pair],
        root_certificates=client_ca.read_bytes() if client_ca is not None else None,
        require_client_auth=client_ca is not None,
    )


@contextlib.asynccontextmanager
async def running_gateway(
    settings: Settings,
    *,
    core: LLMEngine | None = None,
    store: QuotaStore | None = None,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> AsyncIterator[RunningGateway]:
    """Start a gateway; `core` and `store` replace the ones the settings would build. Spans go
    to `tracer_provider` and the GenAI metrics to `meter_provider`; without them the gateway
    does no span or OpenTelemetry metric work."""
    check_exposure(settings)
    # The simulated engine's instant steps run on the event loop: a thread hop would be all they
    # cost. With a step time they sleep it, which on the loop would stall every RPC meanwhile
    instant = core is None and settings.simulated_engine and not settings.simulated_step_s
    store = store if store is not None else make_store(settings)
    jobs = JobRegistry(settings.retained_jobs_per_tenant, settings.retained_bytes_per_tenant)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(store.aclose)
        pools = await open_pools(settings, stack, core, instant)
        planner = _planner(settings, pools)
        lanes = _lanes(settings, pools, planner)
        share = None  # a client only where some pool is granted by it
        if any(lane.core.gated for lane in lanes):
            share = RedisShare(
                settings.store,
                settings.replica(),
                settings.policy,
                slack_calls=settings.share_slack_calls,
            )
            stack.push_async_callback(share.aclose)
        genai = None
        if meter_provider is not None:
            genai = GenAiMetrics(meter_provider.get_meter(TRACER_NAME))
        metrics = GatewayMetrics(settings.metrics_max_tenants, genai=genai)
        dispatcher = await stack.enter_async_context(
            Dispatcher(
                lanes,
                store,
                planner,
                _dispatch_config(settings),
                on_job_end=jobs.ended,
                tracer=tracer(tracer_provider) if tracer_provider is not None else None,
                outbox=Outbox(store, outbox_path(settings)),
                metrics=metrics,
                slo=settings.slo(),
                share=share,
            )
        )
        metrics.watch(dispatcher)
        servers = [b for p in pools.pools for b in p.backends if isinstance(b, OpenAIBackend)]
        for backend in servers:
            backend.on_room = dispatcher.room_changed
            stack.callback(setattr, backend, "on_room", None)  # before the dispatcher closes
        room_news = None
        if settings.store != "memory" and servers:  # other replicas may share the servers
            room_news = RoomNews(settings.store, settings.replica(), servers)
            await stack.enter_async_context(room_news)
        metrics_port = None
        if settings.metrics_port is not None:
            metrics_port = await stack.enter_async_context(
                serving_metrics(metrics, settings.metrics_host, settings.metrics_port)
            )
        server, service, health_servicer = _build_server(
            settings, store, jobs, dispatcher, tracer_provider
        )
        journaling = None
        if settings.store != "memory":
            journaling = await stack.enter_async_context(
                _journaling(settings, stack, service, dispatcher)
            )
            service.journaling = journaling
            dispatcher.fenced = journaling.fenced
        port = _bind(server, settings)
        await server.start()
        await _set_health(health_servicer, True)
        tg = await stack.enter_async_context(anyio.create_task_group())
        if pools.engine is not None:
            tg.start_soon(_report_health, pools.engine, health_servicer)
        elif servers:
            tg.start_soon(_report_servers_health, servers, health_servicer)
        try:
            yield RunningGateway(
                settings,
                port,
                store,
                pools.engine,
                dispatcher,
                jobs,
                service,
                health_servicer,
                metrics_port,
                journaling,
                room_news,
            )
        finally:
            tg.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                await health_servicer.enter_graceful_shutdown()
                if journaling is not None:  # the jobs go on elsewhere: hand them over first
                    service.handing_over = True
                    dispatcher.pause()
                    await journaling.hand_over(
                        lambda: not dispatcher.settling,
                        lambda: _abort_all(dispatcher, "handed over to another replica"),
                    )
                await server.stop(settings.grace_s)
                _abort_all(dispatcher, "server shutting down")


def _dispatch_config(settings: Settings) -> DispatchConfig:
    return DispatchConfig(
        reservation_ttl_s=settings.reservation_ttl_s,
        reserve_deadline_s=settings.reserve_deadline_s,
        max_prompt_chars=settings.max_prompt_chars,
        max_queued_chars=settings.max_queued_chars_per_tenant,
        cache_salt_per_tenant=settings.prefix_cache_per_tenant,
        pool_down_after_s=settings.pool_down_after_s,
    )


def _lanes(settings: Settings, pools: Pools, planner: CallPlanner) -> list[Lane]:
    """A lane per pool, each with a policy of its own; with the redis store a pool of servers
    (which other replicas send calls too) is ordered by the pool's share across replicas."""
    shared_order = settings.store != "memory" and not settings.per_replica_share
    return [
        make_lane(
            pool.model,
            pool.backends,
            pool.tokenizer,
            make_serving_policy(settings.policy),
            planner,
            settings.knee_calls,
            settings.share_slots,
            shared_order and all(b.capabilities.shared for b in pool.backends),
            pool.max_model_len,
        )
        for pool in pools.pools
    ]


def _journaling(
    settings: Settings,
    stack: contextlib.AsyncExitStack,
    service: GatewayService,
    dispatcher: Dispatcher,
) -> Journaling:
    """The journal of this replica's jobs in Redis, and what its events do to the dispatcher."""
    journal = RedisJournal(
        settings.store,
        settings.replica(),
        lease_ttl_s=settings.lease_ttl_s,
        retention_s=settings.job_retention_s,
        max_ended_per_tenant=settings.retained_jobs_per_tenant,
        max_ended_bytes_per_tenant=settings.retained_bytes_per_tenant,
    )
    stack.push_async_callback(journal.aclose)
    return Journaling(
        journal,
        service.take_over,
        on_lost=lambda run: dispatcher.cancel(run, "taken over by another replica"),
        on_cancel=lambda run: dispatcher.cancel(run, "cancelled by the client", charge=True),
        on_renewed=dispatcher.lease_renewed,
        on_fenced=dispatcher.job_fenced,
    )


def _bind(server: grpc.aio.Server, settings: Settings) -> int:
    """The port the server listens on (TLS where the settings name a key and certificate)."""
    address = f"{settings.host}:{settings.port}"
    credentials = server_credentials(settings)
    if credentials is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, credentials)


def _abort_all(dispatcher: Dispatcher, reason: str) -> None:
    for run in list(dispatcher.running_jobs()):
        dispatcher.cancel(run, reason)


async def _set_health(servicer: health.aio.HealthServicer, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.NOT_SERVING
    if serving:
        status = health_pb2.HealthCheckResponse.SERVING
    for name in ("", *SERVICES):
        await servicer.set(name, status)


async def _report_health(engine: AsyncEngine, servicer: health.aio.HealthServicer) -> None:
    """SERVING while the engine can serve, NOT_SERVING while its steps keep failing."""
    serving = True
    while True:
        await engine.health_changed()
        if engine.healthy != serving:
            serving = engine.healthy
            await _set_health(servicer, serving)


async def _report_servers_health(
    servers: list[OpenAIBackend], servicer: health.aio.HealthServicer
) -> None:
    """With remote backends only: SERVING while one of them serves, looked at as each of the
    first one's scrapes lands (they all scrape at about that pace)."""
    serving = True
    while True:
        await servers[0].next_scrape()
        if any(server.capacity().healthy for server in servers) != serving:
            serving = not serving
            await _set_health(servicer, serving)


def _planner(settings: Settings, pool: Pools) -> CallPlanner:
    """Prediction, the guard and limits; the hidden-state refiner when the pool's engine hands
    out hidden states of the size its artifact takes."""
    defaults = CallDefaults(
        settings.default_temperature,
        settings.default_top_p,
        pool.max_model_len,
        settings.ignore_eos,
    )
    cold = PromptModel.load() if settings.length_predictor == "prompt" else None
    hidden_size = pool.hidden_size
    refiner = PromptModel.load(HIDDEN_ARTIFACT) if settings.hidden_refine and hidden_size else None
    if refiner is not None and refiner.hidden_size != hidden_size:
        raise ValueError(
            f"hidden_refine: {HIDDEN_ARTIFACT.name} takes hidden vectors of "
            f"{refiner.hidden_size}, the engine's model hands out {hidden_size}: set "
            "hidden_refine = false for this model"
        )
    history = HistoryPredictor(LENGTH_PRIOR, cold=cold)
    return CallPlanner(history, AnomalyGuard(), defaults, refiner, ErrorTracker())


def _build_server(
    settings: Settings,
    store: QuotaStore,
    jobs: JobRegistry,
    dispatcher: Dispatcher,
    tracer_provider: TracerProvider | None,
) -> tuple[grpc.aio.Server, GatewayService, health.aio.HealthServicer]:
    throttle = FailureThrottle(settings.auth_failures_per_minute)
    budget = LoopBudget(settings.max_loop_share_per_tenant)
    auth = AuthInterceptor(
        store,
        settings.admin_key,
        throttle=throttle,
        loop_budget=budget,
        max_rpcs_per_tenant=settings.max_rpcs_per_tenant,
    )
    interceptors: list[grpc.aio.ServerInterceptor] = [auth]
    if tracer_provider is not None:
        spans = aio_server_interceptor(tracer_provider=tracer_provider)  # type: ignore[no-untyped-call]
        interceptors.insert(0, spans)
    server = grpc.aio.server(
        interceptors=interceptors,
        options=server_options(settings),
        maximum_concurrent_rpcs=settings.max_concurrent_rpcs,
    )
    streams = OpenStreams()
    service = GatewayService(
        jobs,
        dispatcher,
        store,
        streams,
        max_active_jobs=settings.max_active_jobs,
        max_admissions_per_tenant=settings.max_admissions_per_tenant,
        revocations=auth.revocations,
        loop_budget=auth.loop_budget,
    )
    gateway_pb2_grpc.add_GatewayServicer_to_server(service, server)

    async def tenant_deleted(tenant_id: str) -> None:
        auth.forget_tenant(tenant_id)
        streams.close(lambda s: s.tenant_id == tenant_id, "the tenant was deleted")
        for run in dispatcher.running_jobs():
            if run.tenant_id == tenant_id:
                dispatcher.cancel(run, "tenant deleted", charge=True)
        jobs.forget_tenant(tenant_id)
        if dispatcher.metrics is not None:
            dispatcher.metrics.forget_tenant(tenant_id)
        if service.journaling is not None:  # and on every replica: its jobs leave the journal
            await service.journaling.journal.forget_tenant(tenant_id)

    async def key_revoked(tenant_id: str, key_id: str) -> None:
        auth.forget_key(key_id)
        streams.close(lambda s: s.key_id == key_id, "the API key was revoked")
        for run in dispatcher.running_jobs():
            if run.key_id == key_id:
                dispatcher.cancel(run, "API key revoked", charge=True)
        if service.journaling is not None:  # the key's jobs other replicas run
            try:
                await service.journaling.journal.ask_cancel_of_key(tenant_id, key_id)
            except JournalUnavailable:
                log.warning("key %s revoked; its jobs on other replicas run on", key_id)

    admin = AdminService(
        store,
        on_tenant_deleted=tenant_deleted,
        on_key_revoked=key_revoked,
        status=functools.partial(snapshot, dispatcher),
    )
    admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    return server, service, health_servicer


async def serve(settings: Settings) -> None:
    """Run a gateway until SIGINT or SIGTERM; traces go over OTLP when OTEL_* asks for it."""
    provider, meters = setup_tracing(), setup_metrics()
    if provider is not None:
        trace.set_tracer_provider(provider)  # for any library that traces through the global one
    try:
        async with running_gateway(
            settings, tracer_provider=provider, meter_provider=meters
        ) as gateway:
            freeze_startup_heap()
            print(f"fairgate serving on {settings.host}:{gateway.port}", flush=True)
            if gateway.metrics_port is not None:
                where = f"{settings.metrics_host}:{gateway.metrics_port}"
                print(f"metrics on http://{where}/metrics", flush=True)
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    log.info("shutting down")
                    return
    finally:
        for owner in (provider, meters):
            if owner is not None:
                owner.shutdown()
