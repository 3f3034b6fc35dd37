#!/usr/bin/env bash
# Two `cera serve` replicas behind nginx on loopback: checks that requests spread across both
# and that they survive one replica's restart (nginx retries the other replica while one is
# down or loading, whose /v1 routes answer 503).
#
# Usage: bash deploy/nginx/two-replicas.sh [CERA_BINARY] [MODEL]
#   CERA_BINARY  default: target/release/cera (cargo build --release -p cera)
#   MODEL        default: smollm2-135m (fetched into the model cache when missing)
# Needs nginx (Debian: apt-get install nginx) and curl. Exit status 0 when every check passes.
set -euo pipefail
CERA=${1:-target/release/cera}
MODEL=${2:-smollm2-135m}
A=18181 B=18182 LB=18180
WORK=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "two-replicas: FAIL: $*" >&2; exit 1; }

start_replica() { # PORT -> pid
  "$CERA" serve -m "$MODEL" --device cpu --port "$1" -c 1024 >"$WORK/replica-$1.log" 2>&1 &
  echo $!
}
wait_healthy() { # PORT
  for _ in $(seq 1 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/health")" = 200 ] && return 0
    sleep 0.1
  done
  fail "replica on port $1 never became healthy: $(tail -3 "$WORK/replica-$1.log")"
}
requests_of() { # PORT -> cera_requests_total
  curl -s "http://127.0.0.1:$1/metrics" | awk '$1 == "cera_requests_total" {print $2}'
}

pid_a=$(start_replica $A); pids+=("$pid_a")
pid_b=$(start_replica $B); pids+=("$pid_b")
wait_healthy $A
wait_healthy $B

cat >"$WORK/nginx.conf" <<CONF
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path $WORK/body;
  proxy_temp_path $WORK/proxy;
  fastcgi_temp_path $WORK/fastcgi;
  uwsgi_temp_path $WORK/uwsgi;
  scgi_temp_path $WORK/scgi;
  upstream cera {
    server 127.0.0.1:$A max_fails=1 fail_timeout=2s;
    server 127.0.0.1:$B max_fails=1 fail_timeout=2s;
  }
  server {
    listen 127.0.0.1:$LB;
    location / {
      proxy_pass http://cera;
      proxy_http_version 1.1;
      proxy_buffering off;
      proxy_read_timeout 300s;
      # A replica that is down or still loading (503) is skipped: the request goes to the other.
      proxy_next_upstream error timeout http_503 non_idempotent;
    }
  }
}
CONF
nginx -c "$WORK/nginx.conf"

ask() {
  curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$LB/v1/chat/completions" \
    -d '{"messages":[{"role":"user","content":"Say hi."}],"max_tokens":4,"temperature":0}'
}

# 1. Requests spread across both replicas.
for i in $(seq 1 8); do
  [ "$(ask)" = 200 ] || fail "request $i through nginx"
done
ra=$(requests_of $A); rb=$(requests_of $B)
echo "two-replicas: 8 requests: replica A served $ra, replica B $rb"
[ "${ra%.*}" -ge 1 ] && [ "${rb%.*}" -ge 1 ] || fail "requests did not spread (A $ra, B $rb)"

# 2. Replica A restarts: every request still succeeds, through B while A is down or loading.
kill -TERM "$pid_a"; wait "$pid_a" 2>/dev/null || true
pid_a=$(start_replica $A); pids+=("$pid_a")
ok=0
for i in $(seq 1 8); do
  [ "$(ask)" = 200 ] && ok=$((ok + 1))
done
[ $ok = 8 ] || fail "$ok of 8 requests succeeded while replica A restarted"
wait_healthy $A
for i in $(seq 1 8); do
  [ "$(ask)" = 200 ] || fail "request $i after the restart"
done
ra=$(requests_of $A)
[ "${ra%.*}" -ge 1 ] || fail "the restarted replica got no request"
echo "two-replicas: ok (16 more requests across a restart; the restarted replica served $ra)"
