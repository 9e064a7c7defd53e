#!/usr/bin/env bash
# Checks the include direction of docs/design.md ("Include direction"): every
# #include "folder/..." of a library folder names a folder at or below it,
#   launch -> server, driver -> requests -> runtime -> parallel, kernels -> loader -> common
# (server and driver never include each other), and no header includes itself back
# through a cycle of project headers. Prints each violation as file:line and exits 1.
#   check_include_direction.sh [REPO_ROOT]
set -u
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 2

allowed() {  # allowed FOLDER -> the folders it may include
  case $1 in
    common) echo "common" ;;
    loader) echo "loader common" ;;
    kernels) echo "kernels common" ;;
    parallel) echo "parallel loader common" ;;
    runtime) echo "runtime parallel kernels loader common" ;;
    requests) echo "requests runtime loader common" ;;
    server) echo "server requests runtime loader common" ;;
    driver) echo "driver requests runtime parallel loader common" ;;
    launch) echo "launch server driver requests runtime parallel kernels loader common" ;;
  esac
}

bad=0
for folder in common loader kernels parallel runtime requests server driver launch; do
  ok=" $(allowed $folder) "
  while IFS= read -r hit; do
    file=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$rest")
    top=${inc%%/*}
    [ "$top" = "$inc" ] && continue               # a file beside it, no folder
    case "$ok" in *" $top "*) ;; *)
      echo "$file:$line: includes $inc ($folder/ may include only:$(allowed $folder | sed 's/^/ /'))"
      bad=1 ;;
    esac
  done < <(grep -rn --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' '^#include "' "$folder")
done

# Cycles among project headers: a depth-first walk from every header.
declare -A deps state
for h in $(find common loader kernels parallel runtime requests server driver launch -name '*.h' -o -name '*.cuh'); do
  deps[$h]=$(grep -oE '^#include "[^"]+\.(h|cuh)"' "$h" | sed -E 's/#include "(.*)"/\1/' | tr '\n' ' ')
done
visit() {  # visit HEADER PATH...
  local h=$1; shift
  case ${state[$h]:-} in
    done) return ;;
    active) echo "include cycle: $* $h"; bad=1; return ;;
  esac
  state[$h]=active
  local d
  for d in ${deps[$h]:-}; do
    [ -n "${deps[$d]+x}" ] && visit "$d" "$@" "$h ->"
  done
  state[$h]=done
}
for h in "${!deps[@]}"; do visit "$h"; done

[ $bad = 0 ] && echo "include direction: ok (${#deps[@]} headers, no cycle)"
exit $bad
