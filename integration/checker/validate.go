package checker

import (
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func validate(t *hamsv1.Tensor) error { return tensor.Validate(t) }
