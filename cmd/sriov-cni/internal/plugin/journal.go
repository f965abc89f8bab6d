package plugin

// journal is ADD's write-ahead log: the attachment's State, saved before
// each step that changes the node begins. Whatever kills the process
// between two saves, the file names every step that may have happened, and
// teardown undoes them all.
type journal struct {
	store *Store
	st    *State
	point func(string) // failpoint hook (test builds only)
}

// begin writes the first state: nothing changed yet, and all that is needed
// to put things back.
func (j *journal) begin() error {
	if err := j.store.Save(j.st); err != nil {
		return err
	}
	j.failpoint("add:journal")
	return nil
}

// intend records, with mark, that step is about to begin, and saves. When
// the save fails the mark is taken back and the step must not run.
func (j *journal) intend(step string, mark func(*State)) error {
	before := *j.st
	mark(j.st)
	if err := j.store.Save(j.st); err != nil {
		*j.st = before
		return err
	}
	j.failpoint("add:" + step)
	return nil
}

// done saves the state of a finished ADD.
func (j *journal) done() error {
	j.st.Phase = PhaseAdded
	if err := j.store.Save(j.st); err != nil {
		return err
	}
	j.failpoint("add:added")
	return nil
}

func (j *journal) failpoint(name string) {
	if j.point != nil {
		j.point(name)
	}
}
