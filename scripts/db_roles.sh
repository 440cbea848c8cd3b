#!/usr/bin/env bash
# Create Claimcheck's two database roles (and optionally its database), idempotently.
# Run as a PostgreSQL superuser; README, "Database roles".
#
#   scripts/db_roles.sh [options] OWNER APP [DATABASE]
#
#   OWNER      owns the tables; `migrate` connects as it (DATABASE_MIGRATE_URL)
#   APP        web and workers connect as it (DATABASE_URL); owns nothing
#   DATABASE   created if missing, owned by OWNER; only OWNER and APP may connect
#
# Options:
#   --superuser-url URL  where to connect (default postgres://postgres@127.0.0.1:5432/postgres)
#   --createdb           OWNER may create databases (the test suite's test database)
#   --adopt NAME         if database NAME exists, make OWNER its owner (a test database
#                        left behind by a run as another role, which OWNER could not drop)
# Passwords, when set, are applied: OWNER_PASSWORD, APP_PASSWORD (environment).
set -euo pipefail

url="postgres://postgres@127.0.0.1:5432/postgres"
createdb=NOCREATEDB
adopt=""
args=()
while (($#)); do
  case "$1" in
    --superuser-url) url="$2"; shift 2 ;;
    --createdb) createdb=CREATEDB; shift ;;
    --adopt) adopt="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if ((${#args[@]} < 2 || ${#args[@]} > 3)); then
  sed -n '2,16p' "$0" >&2
  exit 2
fi
owner="${args[0]}" app="${args[1]}" database="${args[2]:-}"
name='^[a-z_][a-z0-9_]{0,62}$'
for n in "$owner" "$app" ${database:+"$database"} ${adopt:+"$adopt"}; do
  [[ "$n" =~ $name ]] || { echo "not a plain lower-case name: $n" >&2; exit 2; }
done
[[ "$owner" != "$app" ]] || { echo "OWNER and APP must be different roles" >&2; exit 2; }

has() { [[ -n "$1" ]] && echo true || echo false; }
psql -X -q -v ON_ERROR_STOP=1 -d "$url" \
  -v owner="$owner" -v app="$app" -v createdb="$createdb" \
  -v db="$database" -v has_db="$(has "$database")" \
  -v adopt="$adopt" -v has_adopt="$(has "$adopt")" \
  -v owner_password="${OWNER_PASSWORD:-}" -v app_password="${APP_PASSWORD:-}" <<'SQL'
-- Concurrent runs (several test runs starting at once) take turns.
SELECT pg_advisory_lock(hashtext('claimcheck db_roles')) \g /dev/null

-- Never demote a superuser (or a role that can make roles) named here by mistake.
SELECT format('DO $$ BEGIN RAISE EXCEPTION %L; END $$',
              'role ' || rolname || ' is a superuser or can create roles: name other roles')
  FROM pg_roles
 WHERE rolname IN (:'owner', :'app') AND (rolsuper OR rolcreaterole)
\gexec

SELECT format('CREATE ROLE %I LOGIN', r)
  FROM unnest(ARRAY[:'owner', :'app']) AS r
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r)
\gexec

-- The attributes, whatever they were: the application role creates no
-- databases or roles and is not a member of the owner role.
SELECT format('ALTER ROLE %I LOGIN NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS %s',
              :'owner', :'createdb')
\gexec
SELECT format('ALTER ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS',
              :'app')
\gexec
SELECT format('REVOKE %I FROM %I', :'owner', :'app')
 WHERE pg_has_role(:'app', :'owner', 'MEMBER')
\gexec
SELECT format('ALTER ROLE %I PASSWORD %L', :'owner', :'owner_password')
 WHERE :'owner_password' <> ''
\gexec
SELECT format('ALTER ROLE %I PASSWORD %L', :'app', :'app_password')
 WHERE :'app_password' <> ''
\gexec

\if :has_adopt
SELECT format('ALTER DATABASE %I OWNER TO %I', :'adopt', :'owner')
  FROM pg_database WHERE datname = :'adopt'
\gexec
\endif

\if :has_db
SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'owner')
 WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'db')
\gexec
SELECT format('ALTER DATABASE %I OWNER TO %I', :'db', :'owner')
\gexec
SELECT format('REVOKE ALL ON DATABASE %I FROM PUBLIC', :'db')
\gexec
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', :'db', :'app')
\gexec
\connect :db
-- Only the owner creates objects (before PostgreSQL 15 everyone could create in public).
SELECT format('ALTER SCHEMA public OWNER TO %I', :'owner')
\gexec
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
\endif
SQL
echo "roles $owner (owner) and $app (application) ready${database:+, database $database}"
