#!/usr/bin/env bash
# The guarded-service benchmark (BENCHMARKS.md, "A guarded request against the plain service"):
#
#     bash loadgen/guarded/run.sh
#
# Builds loadgen/src/guarded_service.rs (release), starts it and a Redis server (`appendfsync
# always`, data in a temporary folder, a loopback port), then drives each route with wrk
# (`-t2 -c64`, the Lua script beside this file): plain, plain behind one await (a middleware
# that yields once before the handler, as any awaiting middleware or database call makes a
# request wait), the layer with the store's defaults,
# the layer on `Durability::Buffered`, and the Redis-backed guard; unique keys (a new key per
# request) and duplicates (1000 keys completed by a warm-up run, then replayed). The cells run
# interleaved, PASSES times, each for DURATION seconds; the table gives each cell's median
# requests/s, p50, p99, the ratio to plain, and the CPU per request of the server process
# (getrusage) and of redis-server. Debian's wrk and redis-server are installed when missing.
#
# Settings (environment): DURATION=10 PASSES=3 CONNECTIONS=64 THREADS=2 PORT=8088
# REDIS_PORT=6390 RAW=<file for the per-run lines> SERVER_BIN=<a server built before>.
# BASE_BIN=<another build of the server> runs it beside (on PORT+1, its own stores) and adds
# its two guarded routes as `base-layer` and `base-buffered`, interleaved with the others, so two
# versions of the layer are compared in one run, against the same plain runs.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
here=loadgen/guarded
DURATION=${DURATION:-10}
PASSES=${PASSES:-3}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
PORT=${PORT:-8088}
REDIS_PORT=${REDIS_PORT:-6390}

if ! command -v wrk >/dev/null || ! command -v redis-server >/dev/null; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y wrk redis-server
fi

target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
if [ -n "${SERVER_BIN:-}" ]; then
    server_bin=$SERVER_BIN # another build of the server (to compare two versions of the layer)
else
    cargo build --release -p idemstore-loadgen --bin guarded_service
    server_bin="$target/release/guarded_service"
fi

work=$(mktemp -d)
raw=${RAW:-$target/guarded-bench-raw.txt}
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$work" --save '' \
    --appendonly yes --appendfsync always --daemonize no >"$work/redis.log" 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
for _ in $(seq 50); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
    sleep 0.1
done

"$server_bin" --listen "127.0.0.1:$PORT" --dir "$work/stores" \
    --redis "redis://127.0.0.1:$REDIS_PORT/" >"$work/server.log" 2>&1 &
pids+=("$!")
if [ -n "${BASE_BIN:-}" ]; then
    "$BASE_BIN" --listen "127.0.0.1:$((PORT + 1))" --dir "$work/base-stores" \
        >"$work/base-server.log" 2>&1 &
    pids+=("$!")
fi
for port in "$PORT" ${BASE_BIN:+$((PORT + 1))}; do
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$port/stats" >/dev/null && break
        sleep 0.1
    done
done

# The stats of the server on port $1.
stat() { curl -sf "http://127.0.0.1:$1/stats"; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
# redis-server's CPU so far, µs (utime + stime of /proc/PID/stat).
redis_cpu() {
    awk -v hz="$(getconf CLK_TCK)" '{ print int(($14 + $15) * 1000000 / hz) }' "/proc/$redis_pid/stat"
}

# One wrk run: prints "mode keys req/s p50_us p99_us cpu_us/req redis_us/req non2xx errors
# orders-check".
cell() {
    local mode=$1 keys=$2 tag=$3 seconds=$4
    local before after rbefore rafter out port=$PORT route=$mode
    if [[ $mode == base-* ]]; then
        port=$((PORT + 1)) route=${mode#base-}
    fi
    before=$(stat "$port")
    rbefore=$(redis_cpu)
    out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"${seconds}s" -s "$here/keys.lua" \
        "http://127.0.0.1:$port/$route/api" -- "$keys" "$tag" | grep '^RESULT')
    after=$(stat "$port")
    rafter=$(redis_cpu)
    local requests seconds_run p50 p99 non2xx errors cpu orders
    requests=$(field requests <<<"$out")
    seconds_run=$(field seconds <<<"$out")
    p50=$(field p50_us <<<"$out")
    p99=$(field p99_us <<<"$out")
    non2xx=$(field non2xx <<<"$out")
    errors=$(field errors <<<"$out")
    cpu=$(($(field cpu_us <<<"$after") - $(field cpu_us <<<"$before")))
    orders=$(($(field orders <<<"$after") - $(field orders <<<"$before")))
    awk -v m="$mode" -v k="$keys" -v r="$requests" -v s="$seconds_run" -v p50="$p50" \
        -v p99="$p99" -v c="$cpu" -v rc="$((rafter - rbefore))" -v n="$non2xx" -v e="$errors" \
        -v o="$orders" 'BEGIN { printf "%s %s %.0f %d %d %.1f %.1f %d %d %d\n",
            m, k, r / s, p50, p99, c / r, rc / r, n, e, o }'
}

modes=(plain await layer buffered redis ${BASE_BIN:+base-layer base-buffered})
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "warm-up: 1000 duplicate keys per guarded route, and every route for 2 s"
run=$(date +%s)
for mode in "${modes[@]}"; do
    cell "$mode" dup "dup$run" 2 >/dev/null
    cell "$mode" dup "dup$run" 2 >/dev/null
done
: >"$raw"
for pass in $(seq "$PASSES"); do
    # Each pass starts one mode later, so no mode always runs first.
    for i in "${!modes[@]}"; do
        mode=${modes[$(((i + pass) % ${#modes[@]}))]}
        for keys in unique dup; do
            [[ $mode == plain || $mode == await ]] && [ "$keys" = dup ] && continue
            tag="p$pass-$run"; [ "$keys" = dup ] && tag="dup$run"
            line=$(cell "$mode" "$keys" "$tag" "$DURATION")
            echo "pass $pass: $line" >&2
            echo "$line $pass" >>"$raw"
        done
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# Medians per cell. "vs plain" is the median of each pass's ratio to the plain run of the
# same pass (steadier than a ratio of medians when the machine's load changes between passes).
echo
echo "| route | keys | requests/s | p50 | p99 | vs plain | server CPU/request | redis-server CPU/request | non-2xx | orders run |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
col() { awk -v m="$1" -v k="$2" -v c="$3" '$1 == m && $2 == k { print $c }' "$raw" | median; }
# The median over passes of a cell's requests/s (route $1, keys $2) over route $3's with unique
# keys in the same pass.
ratio() {
    awk -v m="$1" -v k="$2" -v b="$3" '$1 == b && $2 == "unique" { base[$11] = $3 }
        $1 == m && $2 == k { mine[$11] = $3 }
        END { for (p in mine) if (base[p] > 0) print mine[p] / base[p] }' "$raw" | median
}
sum() { awk -v m="$1" -v k="$2" -v c="$3" '$1 == m && $2 == k { s += $c } END { print s + 0 }' "$raw"; }
plain_p99=$(col plain unique 5)
for mode in "${modes[@]}"; do
    for keys in unique dup; do
        [[ $mode == plain || $mode == await ]] && [ "$keys" = dup ] && continue
        rps=$(col "$mode" "$keys" 3)
        awk -v m="$mode" -v k="$keys" -v r="$rps" -v p50="$(col "$mode" "$keys" 4)" \
            -v p99="$(col "$mode" "$keys" 5)" -v c="$(col "$mode" "$keys" 6)" \
            -v rc="$(col "$mode" "$keys" 7)" -v n="$(sum "$mode" "$keys" 8)" \
            -v o="$(sum "$mode" "$keys" 10)" -v x="$(ratio "$mode" "$keys" plain)" -v bp99="$plain_p99" \
            'BEGIN { printf "| %s | %s | %d | %.2f ms | %.2f ms (%.1fx plain) | %.2f | %.1f µs | %.1f µs | %d | %d |\n",
                m, k, r, p50 / 1000, p99 / 1000, p99 / bp99, x, c, rc, n, o }'
    done
done
echo
echo "layer (defaults) against the Redis guard, unique keys: $(ratio layer unique redis)x (median of the passes' ratios)"
echo "against plain behind one await, unique keys: layer $(ratio layer unique await)x, buffered $(ratio buffered unique await)x, redis $(ratio redis unique await)x"
echo "passes: $PASSES x ${DURATION}s per cell, wrk -t$THREADS -c$CONNECTIONS; per-run lines: $raw"
