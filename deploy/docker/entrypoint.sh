#!/bin/sh
# Reads NAME from the file named by NAME_FILE for the settings that carry a password (the database and Redis URLs,
# the first admin's password), so they come from mounted secrets instead of the container's configuration.
# SECRET_KEY_FILE the console reads itself. `up` then makes its /proc files readable by root only.
set -eu
for name in DATABASE_URL REDIS_URL MODELGRID_ADMIN_PASSWORD; do
    eval "file=\${${name}_FILE:-}"
    if [ -n "$file" ]; then
        value=$(cat "$file")
        export "$name=$value"
        unset "${name}_FILE"
    fi
done
exec "$@"
