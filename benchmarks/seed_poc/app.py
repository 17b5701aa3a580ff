# Copied from the seed's proof of concept (the "Minimal PoC" of seed document 003, INRI concept:
# /work/shared/seeds/003_f10e273a40084023.txt; the copy given to the project is
# /work/shared/baselines/seed_poc/app.py). Project-internal material with no separate license: kept here
# only as the baseline benchmarks/bench_poc.py measures INRI against; never shipped, never imported by inri.
# One change: the AMQP URL comes from POC_AMQP_URL (default: the original's), so the benchmark can run its
# own RabbitMQ on a free port. Lint is off for this file (it is the seed's code as written).
# ruff: noqa
# mypy: ignore-errors
"""The seed's minimal proof of concept (seed 003, 'Minimal PoC'): FastAPI + RabbitMQ + an in-memory token
dict. A baseline to measure INRI against, never shipped with it.

Run: RabbitMQ listening on 127.0.0.1:5672 (guest/guest; Debian's rabbitmq-server), then
`uvicorn app:app --host 127.0.0.1 --port 8000` in a virtualenv with fastapi, uvicorn, aio-pika.
API: POST /register {"client_id", "count"} -> {"tokens": [...]}; POST /push {"token", "payload"} -> 202;
GET /pull/{client_id} -> {"messages": [...]} (drains what is queued)."""
import json
import os
import secrets

import aio_pika
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

app = FastAPI()
tokens: dict[str, dict] = {}
state = {}


class Register(BaseModel):
    client_id: str
    count: int = 10


class Push(BaseModel):
    token: str
    payload: dict


@app.on_event("startup")
async def startup():
    conn = await aio_pika.connect_robust(os.environ.get("POC_AMQP_URL", "amqp://guest:guest@127.0.0.1/"))
    state["conn"] = conn
    state["ch"] = await conn.channel()


@app.post("/register")
async def register(r: Register):
    await state["ch"].declare_queue(f"push.{r.client_id}", durable=True)
    out = []
    for _ in range(r.count):
        t = "token-" + secrets.token_hex(16)
        tokens[t] = {"client_id": r.client_id, "used": False}
        out.append(t)
    return {"tokens": out}


@app.post("/push")
async def push(p: Push):
    rec = tokens.get(p.token)
    if rec is None or rec["used"]:
        raise HTTPException(404, "unknown or used token")
    rec["used"] = True
    await state["ch"].default_exchange.publish(
        aio_pika.Message(json.dumps(p.payload).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
        routing_key=f"push.{rec['client_id']}",
    )
    return {"ok": True}


@app.get("/pull/{client_id}")
async def pull(client_id: str):
    q = await state["ch"].declare_queue(f"push.{client_id}", durable=True)
    msgs = []
    while True:
        m = await q.get(no_ack=True, fail=False)
        if m is None:
            break
        msgs.append(json.loads(m.body))
    return {"messages": msgs}
