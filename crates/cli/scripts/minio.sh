# Sourced by the benchmark scripts that keep tables on MinIO: `start_minio DIR` starts
# a MinIO server on loopback with its data under DIR/minio (bucket `phoenix` made),
# stops it when the script exits, and sets `port`. The binary: PHOENIX_MINIO, or minio
# on the PATH, or ~/go/bin/minio (`go install github.com/minio/minio@<version in
# .ci/run>`). Exports the credentials the bench's S3 client reads.
start_minio() {
  local dir=$1
  local minio=${PHOENIX_MINIO:-$(command -v minio || echo "$HOME/go/bin/minio")}
  [ -x "$minio" ] || { echo "no MinIO at $minio (see .ci/run)" >&2; exit 1; }
  mkdir -p "$dir/minio/phoenix"
  export AWS_ACCESS_KEY_ID=phoenix AWS_SECRET_ACCESS_KEY=phoenix-bench-secret
  port=$((20000 + RANDOM % 20000))
  MINIO_ROOT_USER=$AWS_ACCESS_KEY_ID MINIO_ROOT_PASSWORD=$AWS_SECRET_ACCESS_KEY \
    MINIO_BROWSER=off "$minio" server "$dir/minio" --address "127.0.0.1:$port" \
    --console-address "127.0.0.1:$((port + 1))" --quiet >"$dir/minio.log" 2>&1 &
  minio_pid=$!
  # shellcheck disable=SC2064
  trap "kill $minio_pid 2>/dev/null || true" EXIT
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$port/minio/health/live" >/dev/null && break
    sleep 0.2
  done
  curl -sf "http://127.0.0.1:$port/minio/health/live" >/dev/null || { echo "MinIO did not start" >&2; exit 1; }
  echo "MinIO $("$minio" --version | head -1) on 127.0.0.1:$port; $(nproc) cores"
}
