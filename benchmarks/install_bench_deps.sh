#!/bin/sh
# System packages the benchmarks use (never the tests): wrk (the load generator) and rabbitmq-server
# (the seed PoC's broker, benchmarks/bench_poc.py). Installed with apt-get when missing and we are root;
# otherwise this says what is missing and the benchmarks that need it skip with a message.
missing=""
command -v wrk >/dev/null 2>&1 || missing="$missing wrk"
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || command -v rabbitmq-server >/dev/null 2>&1 || missing="$missing rabbitmq-server"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing$missing (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null || echo "apt-get failed for$missing: the benchmarks needing them skip"
else
    echo "missing$missing: install them (Debian: sudo apt-get install$missing); the benchmarks needing them skip"
fi
exit 0
