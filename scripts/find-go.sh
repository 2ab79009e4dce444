# Sourced by the build scripts: sets go_cmd to $GO, else `go` on PATH, else /usr/local/go/bin/go; exits with a
# message when none exists.
go_cmd="${GO:-}"
if [ -z "$go_cmd" ]; then
  if command -v go >/dev/null 2>&1; then
    go_cmd="$(command -v go)"
  elif [ -x /usr/local/go/bin/go ]; then
    go_cmd=/usr/local/go/bin/go
  else
    echo "$(basename "$0"): no Go toolchain found (set GO=/path/to/go)" >&2
    exit 1
  fi
fi
