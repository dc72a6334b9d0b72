package schemas

// Limits returns the document size limits with the REG 9.2.0 defaults
// applied for absent fields. A nil spec yields the defaults.
func (s *DocumentSpec) Limits() (maxRead, maxWrite, maxBatch int64) {
	maxRead, maxWrite, maxBatch = DefaultMaxReadBytes, DefaultMaxWriteBytes, DefaultMaxBatchBytes
	if s == nil {
		return
	}
	if s.MaxReadBytes != nil {
		maxRead = *s.MaxReadBytes
	}
	if s.MaxWriteBytes != nil {
		maxWrite = *s.MaxWriteBytes
	}
	if s.MaxBatchBytes != nil {
		maxBatch = *s.MaxBatchBytes
	}
	return
}
