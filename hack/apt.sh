# Sourced by the hack/ scripts that install Debian packages when a tool is missing:
# apt_install PACKAGE... installs them quietly (output on stderr), updating the package lists
# once if the first try fails; as root, or with passwordless sudo.
apt_install() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  command -v apt-get >/dev/null || return 1
  $sudo apt-get install -y -q "$@" >&2 || { $sudo apt-get update -q >&2 && $sudo apt-get install -y -q "$@" >&2; }
}
