"""The direct ZMQ client: what users and the gateway both run to talk to the scheduler.

`async_client.AsyncZtgiClient` is the asyncio client; `sync_client.ZtgiClient` runs one on an
event loop in a background thread. Underneath, `connection.SchedulerConnection` owns the DEALER
socket and the scheduler's liveness, and `request_router.RequestRouter` hands each event or
reply to the request or query waiting for it. Users import the clients from `ztgi`.
"""
