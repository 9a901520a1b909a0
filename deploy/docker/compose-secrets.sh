#!/bin/sh
# Writes compose.yaml's secrets once, at random, into deploy/docker/secrets/ (a directory only you can open; the
# files inside are readable by the containers' own users, whose uids differ from yours). Existing files are kept:
# delete the directory and the compose volumes together (`docker compose down -v`) to start afresh.
set -eu
dir=$(dirname "$0")/secrets
umask 077
mkdir -p "$dir"
chmod 0700 "$dir"
random() { od -An -tx1 -N32 /dev/urandom | tr -d ' \n'; }
write() {  # NAME VALUE: only when missing
    if [ ! -s "$dir/$1" ]; then
        printf '%s\n' "$2" > "$dir/$1"
        chmod 0444 "$dir/$1"
    fi
}
write secret_key "$(random)"
write admin_password "$(random | cut -c1-24)"
write db_password "$(random)"
write database_url "postgres://modelgrid:$(cat "$dir/db_password")@postgres:5432/modelgrid"
redis=$(random)
write redis_conf "requirepass $redis"
write redis_url "redis://:$(sed -n 's/^requirepass //p' "$dir/redis_conf")@redis:6379/0"
echo "secrets in $dir"
