"""`cep search …`: manage saved searches and test queries.

    cep search add 'bedrooms:3 AND price:<400000' --owner alice --kafka-topic alerts
    cep search ls [--owner alice]        cep search show ID       cep search rm ID
    cep search test 'city:amsterdam~1' --event '{"city": "Amstredam"}'
    cep search key OWNER                 (prints a new API key; only its hash is stored)
    cep search serve [--host --port]     (the HTTP API)

`test` explains why the event matches or not and exits like grep: 0 match, 1 no match, 2 query
error. The other commands use Redis and Kafka: `--redis URL` and `--bootstrap HOST:PORT`, as the
other commands, else the configuration (`cep --config`, CEP_REDIS_URL, CEP_KAFKA_BOOTSTRAP).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cep.errors import CepError, ConfigError, QueryError
from cep.events import parse_object
from percolator.analysis import Schema
from percolator.model import Target


def register(sub: Any) -> None:
    p = sub.add_parser("search", help="saved searches (the percolator): add, ls, show, rm, test")
    ss = p.add_subparsers(dest="search_command", metavar="ACTION")
    ss.required = True

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--schema", help="schema file (JSON or YAML) declaring field types")

    def services(q: argparse.ArgumentParser, kafka: bool = True) -> None:
        q.add_argument("--redis", dest="redis_url", help="Redis URL (default: CEP_REDIS_URL)")
        if kafka:  # the registry writes each change to the changelog topic
            q.add_argument("--bootstrap", dest="kafka_bootstrap",
                           help="Kafka bootstrap servers (default: CEP_KAFKA_BOOTSTRAP)")

    a = ss.add_parser("add", help="save a search")
    a.add_argument("query")
    a.add_argument("--owner", required=True)
    a.add_argument("--id", dest="search_id")
    a.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE")
    a.add_argument("--kafka-topic", action="append", default=[])
    a.add_argument("--redis-channel", action="append", default=[])
    common(a)
    services(a)
    a.set_defaults(func=_add)

    ls = ss.add_parser("ls", help="list saved searches")
    ls.add_argument("--owner")
    ls.add_argument("--json", action="store_true")
    services(ls, kafka=False)
    ls.set_defaults(func=_ls)

    sh = ss.add_parser("show", help="show one saved search")
    sh.add_argument("search_id")
    sh.add_argument("--owner")
    services(sh, kafka=False)
    sh.set_defaults(func=_show)

    rm = ss.add_parser("rm", help="remove a saved search")
    rm.add_argument("search_id")
    rm.add_argument("--owner", help="only remove it if it belongs to this owner")
    services(rm)
    rm.set_defaults(func=_rm)

    t = ss.add_parser("test", help="does an event match a query, and why (exit 0/1/2)")
    t.add_argument("query")
    t.add_argument("--event", required=True, help="the event as JSON, or @file.json")
    t.add_argument("--json", action="store_true", help="print the explanation as JSON")
    t.add_argument("--quiet", "-q", action="store_true", help="print nothing, exit code only")
    common(t)
    t.set_defaults(func=_test)

    k = ss.add_parser("key", help="create an API key for an owner")
    k.add_argument("owner")
    services(k, kafka=False)
    k.set_defaults(func=_key)

    sv = ss.add_parser("serve", help="run the HTTP API")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8080)
    common(sv)
    services(sv)
    sv.set_defaults(func=_serve)


def _schema(args: argparse.Namespace) -> Schema:
    path = getattr(args, "schema", None)
    return Schema.load(path) if path else Schema()


def _settings(args: argparse.Namespace) -> Any:
    from cep.cli.common import settings

    # `cep console --searches` calls redis_client/registry with its own args: no such flags there.
    return settings(args, redis_url=getattr(args, "redis_url", None),
                    kafka_bootstrap=getattr(args, "kafka_bootstrap", None))


def redis_client(args: argparse.Namespace) -> Any:
    import redis

    from cep.delivery.preflight import require_redis

    url = _settings(args).redis_url
    require_redis(url)  # one line naming Redis when it is down, not a traceback
    return redis.Redis.from_url(url)


def registry(args: argparse.Namespace) -> Any:
    from cep.delivery.preflight import kafka_topics, require_redis
    from percolator.changelog import KafkaChangelog
    from percolator.registry import SearchRegistry
    from percolator.store import RedisSearchStore

    settings = _settings(args)
    # One line naming the service that is down, not librdkafka's retries and a traceback.
    require_redis(settings.redis_url)
    kafka_topics(settings.kafka_bootstrap, dict(settings.kafka_options))
    store = RedisSearchStore.from_url(settings.redis_url)
    log = KafkaChangelog(settings.kafka_bootstrap, options=dict(settings.kafka_options))
    return SearchRegistry(store, log, _schema(args))


def _print_search(data: dict[str, Any]) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False))


def _add(args: argparse.Namespace) -> int:
    meta: dict[str, str] = {}
    for item in args.meta:
        if "=" not in item:
            raise ConfigError(f"--meta takes KEY=VALUE, not {item!r}")
        k, v = item.split("=", 1)
        meta[k] = v
    targets = [Target("kafka", t) for t in args.kafka_topic]
    targets += [Target("redis", c) for c in args.redis_channel]
    search = registry(args).add(args.owner, args.query, search_id=args.search_id,
                                 metadata=meta, targets=targets)
    print(search.id)
    return 0


def _ls(args: argparse.Namespace) -> int:
    from percolator.store import RedisSearchStore

    searches = RedisSearchStore(redis_client(args)).list(args.owner)
    if args.json:
        print(json.dumps([s.to_dict() for s in searches], indent=2, ensure_ascii=False))
        return 0
    for s in searches:
        print(f"{s.id}\t{s.owner}\tv{s.version}\t{s.query}")
    return 0


def _find(args: argparse.Namespace) -> Any:
    from percolator.store import RedisSearchStore

    search = RedisSearchStore(redis_client(args)).get(args.search_id)
    if search is None or (args.owner and search.owner != args.owner):
        print(f"no search {args.search_id!r}", file=sys.stderr)
        return None
    return search


def _show(args: argparse.Namespace) -> int:
    search = _find(args)
    if search is None:
        return 1
    _print_search(search.to_dict())
    return 0


def _rm(args: argparse.Namespace) -> int:
    search = _find(args)
    if search is None:
        return 1
    registry(args).remove(search.owner, search.id)
    print(f"removed {search.id}")
    return 0


def _test(args: argparse.Namespace) -> int:
    from percolator.explain import explain

    raw: str | bytes = args.event
    try:
        if isinstance(raw, str) and raw.startswith("@"):
            with open(raw[1:], "rb") as fh:
                raw = fh.read()
    except OSError as exc:
        print(f"error: cannot read --event file: {exc}", file=sys.stderr)
        return 2
    # The one definition of a readable event (cep.events), as the percolate job applies it.
    event, reason = parse_object(raw.encode("utf-8", "surrogatepass")
                                 if isinstance(raw, str) else raw)
    if event is None:
        print(f"error: --event is not a valid event: {reason}", file=sys.stderr)
        return 2
    try:
        result = explain(args.query, event, _schema(args))
    except QueryError as exc:
        if not args.quiet:
            print(exc.render(), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    elif not args.quiet:
        print(result.render())
    return 0 if result.matched else 1


def _key(args: argparse.Namespace) -> int:
    from percolator.store import RedisApiKeys

    print(RedisApiKeys(redis_client(args)).create(args.owner))
    return 0


def _serve(args: argparse.Namespace) -> int:  # pragma: no cover - runs a server
    import uvicorn

    from percolator.api import create_app
    from percolator.store import RedisApiKeys

    try:
        app = create_app(registry(args), RedisApiKeys(redis_client(args)))
    except CepError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    uvicorn.run(app, host=args.host, port=args.port)
    return 0
