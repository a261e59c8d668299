# Sourced by .ci/run: a throwaway PostgreSQL server on loopback for the sweep's shared-storage test
# (tests/experiments/multi/test_sweep.py, issue 11). Debian's package, installed when missing; the
# server runs as the `postgres` user from a temporary data folder and stops when CI exits.
start_postgres() {
    if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
        if [ "$(id -u)" != 0 ]; then
            echo "postgres: not installed and not root; the PostgreSQL test will be skipped" >&2
            return 0
        fi
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fi
    local bin port=54329
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
    PG_CI_DATA=$(mktemp -d)
    local run=()
    if [ "$(id -u)" = 0 ]; then
        chown postgres "$PG_CI_DATA"
        run=(runuser -u postgres --)  # the server refuses to run as root
    fi
    "${run[@]}" "$bin/initdb" -D "$PG_CI_DATA/db" -A trust -U postgres >/dev/null
    "${run[@]}" "$bin/pg_ctl" -D "$PG_CI_DATA/db" -l "$PG_CI_DATA/log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $PG_CI_DATA" start >/dev/null
    PG_CI_STOP=("${run[@]}" "$bin/pg_ctl" -D "$PG_CI_DATA/db" -m fast stop)
    export CLP_TEST_POSTGRES_URL="postgresql+psycopg2://postgres@127.0.0.1:$port/postgres"
    echo "postgres: $("$bin/postgres" --version) on 127.0.0.1:$port"
}

stop_postgres() {
    if [ -n "${PG_CI_DATA:-}" ]; then
        "${PG_CI_STOP[@]}" >/dev/null 2>&1 || true
        rm -rf "$PG_CI_DATA"
    fi
}
