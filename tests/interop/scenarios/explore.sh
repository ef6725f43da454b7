#!/bin/bash
# interop-timeout: 200
. "$(dirname "$0")/common.sh"
NQN=$KERNEL_NQN; PORT=$KERNEL_TCP_PORT
modprobe nvme-tcp
nvmet_up "$NQN" tcp 127.0.0.1 $PORT 30 64
nvme version
cat /etc/nvme/hostnqn /etc/nvme/hostid
nvme connect -t tcp -a 127.0.0.1 -s $PORT -n $NQN --nr-io-queues=2 -o json; echo rc=$?
sleep 1
C=$(ctrl_for_nqn $NQN); D=$(ns_dev $NQN 1); echo "C=$C D=$D"
ls /sys/class/nvme/$C/; cat /sys/class/nvme/$C/{cntlid,state,address,queue_count,sqsize} 2>&1
ls /sys/block/${D#/dev/}/ ; cat /sys/block/${D#/dev/}/{nsid,uuid,wwid} 2>&1; ls -la /sys/block/${D#/dev/}/device
nvme id-ctrl /dev/$C -o json | jq -c '{subnqn,cntlid,mdts,ioccsz,iorcsz,oncs,kas,sgls,vid,sn,mn}'
nvme id-ns $D -o json | jq -c '{nsze,ncap,nuse,flbas,lbafs}'
nvme ns-descs $D -o json; nvme ns-descs $D
nvme smart-log /dev/$C -o json | jq -c .
nvme get-feature /dev/$C -f 7; echo rc=$?
nvme get-feature /dev/$C -f 7 -o json 2>&1; echo rc=$?
nsze=$(nvme id-ns $D -o json | jq .nsze)
nvme read $D -s $((nsze-1)) -c 0 -z 512 -d /tmp/x; echo last-rc=$?
nvme read $D -s $nsze -c 0 -z 512 -d /tmp/x; echo past-rc=$?
nvme flush $D; echo flush-rc=$?
cat /sys/block/${D#/dev/}/queue/discard_max_bytes
blkdiscard $D; echo discard-rc=$?
nvme reset /dev/$C; echo reset-rc=$?; sleep 1; cat /sys/class/nvme/$C/state
nvme disconnect -n $NQN
nvme discover -t tcp -a 127.0.0.1 -s $PORT --hostnqn=nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555 --hostid=11111111-2222-3333-4444-555555555555; echo disc-rc=$?
nvme connect-all -t tcp -a 127.0.0.1 -s $PORT; echo ca-rc=$?
sleep 1; nvme list -o json | jq -c .
nvme list-subsys
nvme disconnect-all; echo dall=$?
nvme connect -t tcp -a 127.0.0.1 -s $PORT -n $NQN --keep-alive-tmo=5 --reconnect-delay=1 --ctrl-loss-tmo=60; echo rc=$?
sleep 1; C=$(ctrl_for_nqn $NQN); cat /sys/class/nvme/$C/{state,kato} 2>&1
nvme disconnect -n $NQN
nvmet_down $NQN 30
dmesg | tail -30
