"""`inri gateway`: the wake-up gateway an app developer runs for phones that cannot hold a socket.

A home relay POSTs a content-free wake-up (an opaque token, nothing else) to the app's gateway; the
gateway opens the token with its key (inri/protocol/wake.py), finds the APNs or FCM device token in
it, and asks Apple or Google to wake the app, which then pulls its messages from its home relay.
The APNs key and the FCM service account stay with the app developer: no relay operator holds them.

Modules: `config` (the TOML file), `keys` (the sealing key), `jws` (the provider JWTs), `provider`
(what a provider answers), `apns` and `fcm` (the providers), `app` (the HTTP API), `metrics`,
`server` (serving it). docs/gateway.md is the specification and the app developer's how-to.
"""
