package netfault

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// The test binary re-executed as an echo server (the process isolated).
func TestMain(m *testing.M) {
	if os.Getenv("NETFAULT_ECHO") == "1" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			os.Exit(1)
		}
		fmt.Println(l.Addr().String())
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(0)
			}
			go func() {
				defer c.Close()
				b := make([]byte, 64)
				for {
					n, err := c.Read(b)
					if err != nil {
						return
					}
					_, _ = c.Write(b[:n])
				}
			}()
		}
	}
	os.Exit(m.Run())
}

func echo(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	b := make([]byte, 4)
	_, err = c.Read(b)
	return err
}

func TestIsolateCutsAndHealRestores(t *testing.T) {
	if err := Supported(); err != nil {
		t.Skip(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "NETFAULT_ECHO=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	addr = addr[:len(addr)-1]
	if err := echo(addr); err != nil {
		t.Fatalf("before: %v", err)
	}
	_, portS, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portS)
	iso, err := Isolate(cmd.Process.Pid, port)
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := echo(addr); err == nil {
		_ = iso.Heal()
		t.Fatal("the isolated process still answered")
	}
	if err := iso.Heal(); err != nil {
		t.Fatal(err)
	}
	if err := iso.Heal(); err != nil {
		t.Fatalf("second heal: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := echo(addr); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("after heal: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
