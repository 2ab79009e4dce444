# Sourced by the image scripts (build-driver-image.sh, build-kind-node-image.sh): how they make a Debian tree.
# mmdebstrap_slim: no recommends, a merged /usr without the usrmerge package (and perl), no docs, man pages or
# locales. apt_sources prints this machine's apt sources for Debian $suite, $suite-updates and $suite-security
# (one-line and deb822 files), main only, one "deb URI SUITE main" line each, for mmdebstrap.
mmdebstrap_slim=(
  --aptopt='APT::Install-Recommends "false"'
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
)

apt_sources() {
  {
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk '$1 == "deb" {sub(/^deb +(\[[^]]*\] +)?/, ""); print $1, $2}'
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -f "$f" ] || continue
      awk '
        function flush(  u, s, nu, ns, i, j) {
          if (types ~ /(^| )deb( |$)/ && enabled != "no") {
            nu = split(uris, u, " "); ns = split(suites, s, " ")
            for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) print u[i], s[j]
          }
          types = uris = suites = enabled = ""
        }
        /^[ \t]*#/ {next}
        /^[ \t]*$/ {flush(); next}
        /^[A-Za-z-]+:/ {
          key = tolower(substr($0, 1, index($0, ":") - 1)); val = substr($0, index($0, ":") + 1)
          gsub(/^[ \t]+|[ \t]+$/, "", val)
          if (key == "types") types = val; else if (key == "uris") uris = val
          else if (key == "suites") suites = val; else if (key == "enabled") enabled = tolower(val)
        }
        END {flush()}' "$f"
    done
  } | awk -v suite="$suite" '$2 == suite || $2 == suite "-updates" || $2 == suite "-security" || $2 == suite "/updates" {
        print "deb " $1 " " $2 " main"}' | sort -u
}
