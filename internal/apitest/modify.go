package apitest

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// Modify changes the object name as a user or another controller would
// while a controller under test may be writing it too: it reads it,
// applies change and writes it back with update (Update, UpdateStatus),
// and starts again from a fresh read when the write conflicts. It returns
// what the API server stored.
func Modify[T any](ctx context.Context, name string,
	get func(context.Context, string, metav1.GetOptions) (T, error),
	update func(context.Context, T, metav1.UpdateOptions) (T, error),
	opts metav1.UpdateOptions, change func(T)) (T, error) {
	var out T
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(obj)
		out, err = update(ctx, obj, opts)
		return err
	})
	return out, err
}
