package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuSnap is the CPU time used so far, from /proc (zero elsewhere): by this
// process, by the benchmark's Postgres server (its postmaster and children;
// every postgres process on the machine when the server's pid is unknown),
// by the Kafka and RocketMQ JVMs (by main class), and by the machine as a
// whole (busy and total ticks over all cores). Processes are kept per pid,
// so that one that exits during a row does not make the difference negative;
// the server's children that exit (the connections of a pool closed within
// the row, autovacuum workers) still count, through the server's time of
// its exited children.
type cpuSnap struct {
	self        time.Duration
	procs       map[int]procCPU
	busy, total time.Duration
}

type procCPU struct {
	kind string // "postgres", "kafka", "rocketmq"
	used time.Duration
	// reaped: a child of the benchmark's Postgres server, whose CPU time
	// moves to the server's children's time when it exits
	reaped bool
}

// cpuUsed is the CPU time used between two snapshots.
type cpuUsed struct {
	self, postgres, kafka, rocketmq time.Duration
	busy, total                     time.Duration
}

// other is the machine's busy time not accounted to the processes above:
// other programs, the kernel's own work (loopback networking, disk).
func (u cpuUsed) other() time.Duration {
	return max(u.busy-u.self-u.postgres-u.kafka-u.rocketmq, 0)
}

func (c cpuSnap) since(c0 cpuSnap) cpuUsed {
	u := cpuUsed{self: c.self - c0.self, busy: c.busy - c0.busy, total: c.total - c0.total}
	for pid, p := range c.procs {
		d := p.used - c0.procs[pid].used // a process started since c0 counts whole
		switch p.kind {
		case "postgres":
			u.postgres += d
		case "kafka":
			u.kafka += d
		case "rocketmq":
			u.rocketmq += d
		}
	}
	for pid, p := range c0.procs {
		if _, ok := c.procs[pid]; !ok && p.reaped {
			// Exited since c0: its whole CPU time is now in its server's
			// (counted above), of which the part before c0 is not the row's.
			u.postgres -= p.used
		}
	}
	return u
}

// snapCPU takes a snapshot; pgServer is the Postgres postmaster's pid, 0 if
// unknown.
func snapCPU(pgServer int) cpuSnap {
	c := cpuSnap{self: cpuTime(), procs: map[int]procCPU{}}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile("/proc/" + d.Name() + "/comm")
		if err != nil {
			continue
		}
		var kind string
		switch strings.TrimSpace(string(comm)) {
		case "postgres":
			kind = "postgres"
		case "java":
			cmd, _ := os.ReadFile("/proc/" + d.Name() + "/cmdline")
			switch {
			case strings.Contains(string(cmd), "kafka.Kafka"):
				kind = "kafka"
			case strings.Contains(string(cmd), "org.apache.rocketmq.broker.BrokerStartup"),
				strings.Contains(string(cmd), "org.apache.rocketmq.namesrv.NamesrvStartup"):
				kind = "rocketmq"
			}
		}
		if kind == "" {
			continue
		}
		f := procStat(pid)
		if len(f) <= 14 {
			continue
		}
		if kind == "postgres" && pgServer != 0 && pid != pgServer && f[1] != strconv.Itoa(pgServer) {
			continue // another Postgres server on this machine
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		p := procCPU{kind: kind, used: ticks(u + s)}
		if kind == "postgres" && pgServer != 0 {
			if pid == pgServer {
				// The exited backends' time (cutime, cstime): a pool
				// closed before the row's last snapshot took its
				// connections' CPU with it.
				cu, _ := strconv.ParseInt(f[13], 10, 64)
				cs, _ := strconv.ParseInt(f[14], 10, 64)
				p.used += ticks(cu + cs)
			} else {
				p.reaped = true
			}
		}
		c.procs[pid] = p
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		for i, v := range strings.Fields(line)[1:] {
			if i >= 8 { // user nice system idle iowait irq softirq steal; guest is in user
				break
			}
			t, _ := strconv.ParseInt(v, 10, 64)
			c.total += ticks(t)
			if i != 3 && i != 4 {
				c.busy += ticks(t)
			}
		}
	}
	return c
}

// procStat returns the fields of /proc/pid/stat after the command name:
// state, ppid, ... (f[1] is the parent, f[11] utime, f[12] stime, f[13]
// cutime and f[14] cstime: the CPU time of its children that exited).
func procStat(pid int) []string {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 || i+2 > len(stat) {
		return nil
	}
	return strings.Fields(string(stat[i+2:]))
}

// serverOf returns the postmaster of a local Postgres backend (its parent),
// or 0 when the backend does not run on this machine.
func serverOf(backend int) int {
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(backend) + "/comm")
	if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
		return 0
	}
	f := procStat(backend)
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

func ticks(n int64) time.Duration { return time.Duration(n) * 10 * time.Millisecond } // USER_HZ = 100

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
