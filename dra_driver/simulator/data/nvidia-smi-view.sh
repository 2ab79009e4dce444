# Out of reach of the simulator's state (in a container): answer from the device nodes here, as the real nvidia-smi
# sees only the GPUs it can open (/dev/nvidia<minor>) and the MIG devices whose capability nodes
# (/dev/nvidia-caps/nvidia-cap<N>) it has. Shell builtins only, so any image with a POSIX /bin/sh runs it. The table
# at the end of the loop is the simulated kernel's view of the machine, rewritten whenever its MIG devices change.
if [ ! -f "${self%/*}/../../../nvml-state.json" ]; then
  bad() {
    echo "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
    exit 2
  }
  lines() { while IFS= read -r l; do printf '%s\n' "$l"; done; }
  nl='
'
  mode=table fields= format= out=
  while [ $# -gt 0 ]; do
    opt=$1 val=
    case $opt in --*=*) val=${opt#*=} opt=${opt%%=*} ;; esac
    case $opt in
    -L | --list-gpus) mode=list ;;
    --query-gpu | --format)
      if [ -z "$val" ]; then
        [ $# -ge 2 ] || bad
        shift
        val=$1
      fi
      if [ "$opt" = --format ]; then format=$val; else mode=query fields=$val; fi
      ;;
    -h | --help)
      echo "nvidia-smi (simulated, in a container): nvidia-smi [-L | --query-gpu=FIELDS --format=csv[,noheader][,nounits]]"
      echo "FIELDS: index, uuid, name, pci.bus_id, memory.total, driver_version"
      exit 0
      ;;
    *) bad ;;
    esac
    shift
  done
  set -f
  header= units=" MiB"
  if [ $mode = query ]; then
    case $format in csv | csv,*) ;; '') bad ;; *)
      echo "\"$format\" is not a valid format."
      exit 2
      ;;
    esac
    IFS=,
    for f in ${format#csv}; do
      case $f in '') ;; noheader) header=none ;; nounits) units= ;; *)
        echo "\"$format\" is not a valid format."
        exit 2
        ;;
      esac
    done
    IFS=', '
    for f in $fields; do
      case $f in index | uuid | name | pci.bus_id | memory.total | driver_version) ;; *)
        echo "Field \"$f\" is not a valid field to query."
        exit 2
        ;;
      esac
      [ "$header" = none ] || header="${header:+$header, }$f"
    done
    unset IFS
    [ "$header" = none ] || out="$header$nl"
  elif [ -n "$format" ]; then
    bad
  fi
  if [ ! -c /dev/nvidiactl ]; then
    echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." \
      "Make sure that the latest NVIDIA driver is installed and running."
    exit 9
  fi
  n=0 rows= migs= visible=
  # driver|<version>|<CUDA version>; gpu|<minor>|<bus id>|<UUID>|<MiB>|<MIG mode>|<name>, by bus id, each followed
  # by its MIG devices: mig|<GI capability minor>|<CI capability minor>|<GI>|<CI>|<MiB>|<UUID>|<profile>
  while IFS='|' read -r kind a b c d e f g; do
    case $kind in
    driver) driver=$a cuda=$b ;;
    gpu)
      visible= m=0
      [ -c "/dev/nvidia$a" ] || continue
      visible=1 i=$n n=$((n + 1))
      case $mode in
      list) out="${out}GPU $i: $f (UUID: $c)$nl" ;;
      query)
        row= IFS=', '
        for field in $fields; do
          case $field in
          index) v=$i ;; uuid) v=$c ;; name) v=$f ;; pci.bus_id) v=$b ;; driver_version) v=$driver ;;
          memory.total) v=$d$units ;;
          esac
          row="${row:+$row, }$v"
        done
        unset IFS
        out="$out$row$nl"
        ;;
      table)
        rows="$rows$(printf '| %3d  %-29.29s %3s  | %18s %3s | %20s |' "$i" "$f" On "$b" Off N/A)$nl"
        rows="$rows$(printf '| N/A   N/A    P0             N/A /  N/A  | %10s / %9s | %6s %13s |' 0MiB "${d}MiB" N/A N/A)$nl"
        rows="$rows$(printf '|%41s|%24s| %20s |' '' '' "$e")$nl"
        ;;
      esac
      ;;
    mig)
      [ -n "$visible" ] && [ -c "/dev/nvidia-caps/nvidia-cap$a" ] && [ -c "/dev/nvidia-caps/nvidia-cap$b" ] || continue
      case $mode in
      list) out="$out$(printf '  MIG %-11s Device %2d: (UUID: %s)' "$g" "$m" "$f")$nl" ;;
      table) migs="$migs$(printf '| %2d %4d %3d %3d  | %16s / %-13s | %9s | %21s |' "$i" "$c" "$d" "$m" 0MiB "${e}MiB" N/A N/A)$nl" ;;
      esac
      m=$((m + 1))
      ;;
    esac
  done <<'DEVICES'
@DEVICES@
DEVICES
  if [ $n = 0 ]; then
    echo "No devices were found"
    exit 6
  fi
  [ $mode != table ] && printf '%s' "$out" && exit 0
  rule=+-----------------------------------------------------------------------------------------+
  cells=+-----------------------------------------+------------------------+----------------------+
  echo "$rule"
  printf '| NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %-8s |\n' "$driver" "$driver" "$cuda"
  lines <<'HEAD'
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
HEAD
  printf '%s' "$rows"
  echo "$cells"
  if [ -n "$migs" ]; then
    echo
    echo "$rule"
    lines <<'HEAD'
| MIG devices:                                                                            |
+------------------+----------------------------------+-----------+-----------------------+
| GPU  GI  CI  MIG |                     Memory-Usage |        Vol|        Shared         |
|      ID  ID  Dev |                       BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |
|                  |                                  |        ECC|                       |
|==================+==================================+===========+=======================|
HEAD
    printf '%s' "$migs"
    echo "+------------------+----------------------------------+-----------+-----------------------+"
  fi
  echo
  echo "$rule"
  lines <<'TAIL'
| Processes:                                                                              |
|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
TAIL
  exit 0
fi
