package testenv

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer that a logger or a child's stderr (writing
// from other goroutines) and the test reading it may share.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
