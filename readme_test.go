package dlock_test

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestREADMESnippets: every ```go block of README.md appears verbatim, after
// trimming common indentation and the rewrites of readmeRewrites, in the
// body of an Example in one of the package's example files; a complete
// program (a block that starts with "package") must have the body of its
// main there, and must type-check as it stands. So every snippet compiles,
// and those whose Example has an Output comment run with the tests.
func TestREADMESnippets(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlocks(string(readme))
	if len(blocks) == 0 {
		t.Fatal("README.md has no go blocks")
	}
	bodies := exampleBodies(t)
	for _, b := range blocks {
		snippet := b.lines
		if strings.HasPrefix(strings.TrimSpace(b.text()), "package ") {
			typeCheck(t, b)
			snippet = mainBody(t, b)
		}
		snippet = rewrite(snippet)
		if !foundIn(dedent(snippet), bodies) {
			t.Errorf("README.md:%d: this go block is not in the body of any Example in *example_test.go, verbatim:\n%s",
				b.line, strings.Join(dedent(snippet), "\n"))
		}
	}
}

// readmeRewrites turns the README's words into its examples': the quick
// start's database, "app", is exampleDB in Example_readmeQuickStart, so
// that the example writes to no database a user's server may hold.
var readmeRewrites = strings.NewReplacer(`mc.Database("app")`, `mc.Database("`+exampleDB+`")`)

// rewrite returns the lines of a README snippet with readmeRewrites
// applied.
func rewrite(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = readmeRewrites.Replace(l)
	}
	return out
}

// TestREADMEJobTest runs the README's dlocktest snippet as the test it is.
func TestREADMEJobTest(t *testing.T) {
	Example_readmeTesting()
	readmeJobTest(t)
}

// A codeBlock is one fenced block of README.md: its lines, and the line
// number of its first.
type codeBlock struct {
	line  int
	lines []string
}

func (b codeBlock) text() string { return strings.Join(b.lines, "\n") + "\n" }

// goBlocks returns the ```go blocks of a markdown text.
func goBlocks(md string) []codeBlock {
	var blocks []codeBlock
	var cur *codeBlock
	for i, line := range strings.Split(md, "\n") {
		fence := strings.TrimSpace(line)
		switch {
		case cur == nil && fence == "```go":
			cur = &codeBlock{line: i + 2}
		case cur != nil && fence == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, line)
		}
	}
	return blocks
}

// exampleBodies returns the lines of the body of every Example function in
// the package's example files.
func exampleBodies(t *testing.T) map[string][]string {
	files, err := filepath.Glob("*example_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example files: %v", err)
	}
	bodies := map[string][]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Example") {
				continue
			}
			body := src[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset]
			bodies[name+": "+fn.Name.Name] = strings.Split(string(body), "\n")
		}
	}
	return bodies
}

// mainBody returns the lines of the body of func main in a program.
func mainBody(t *testing.T, b codeBlock) []string {
	fset := token.NewFileSet()
	src := b.text()
	f, err := parser.ParseFile(fset, "README.md", src, 0)
	if err != nil {
		t.Fatalf("README.md:%d: %v", b.line, err)
	}
	for _, d := range f.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "main" && fn.Recv == nil {
			body := src[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset]
			return strings.Split(body, "\n")
		}
	}
	t.Fatalf("README.md:%d: a program without func main", b.line)
	return nil
}

// typeCheck type-checks a complete program against the export data of the
// packages it imports, as the go command builds them.
func typeCheck(t *testing.T, b codeBlock) {
	fset := token.NewFileSet()
	src := strings.Repeat("\n", b.line-1) + b.text() // positions are README.md's
	f, err := parser.ParseFile(fset, "README.md", src, 0)
	if err != nil {
		t.Fatalf("README.md:%d: %v", b.line, err)
	}
	args := []string{"list", "-export", "-f", "{{.ImportPath}}={{.Export}}"}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		args = append(args, path)
	}
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("README.md:%d: go %s: %v", b.line, strings.Join(args, " "), err)
	}
	exports := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if path, file, ok := strings.Cut(line, "="); ok {
			exports[path] = file
		}
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		return os.Open(exports[path])
	})}
	if _, err := conf.Check("main", fset, []*ast.File{f}, nil); err != nil {
		t.Errorf("README.md:%d: the program does not compile: %v", b.line, err)
	}
}

// dedent removes the leading and trailing blank lines of a snippet and
// the indentation its other lines have in common.
func dedent(lines []string) []string {
	for len(lines) > 0 && strings.TrimSpace(lines[0]) == "" {
		lines = lines[1:]
	}
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	prefix, first := "", true
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		indent := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		if first {
			prefix, first = indent, false
			continue
		}
		n := 0
		for n < len(prefix) && n < len(indent) && prefix[n] == indent[n] {
			n++
		}
		prefix = prefix[:n]
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		if strings.TrimSpace(l) != "" {
			out[i] = strings.TrimPrefix(l, prefix)
		}
	}
	return out
}

// foundIn reports whether snippet appears in one of bodies as consecutive
// lines, each indented by the same prefix (blank lines match blank lines).
func foundIn(snippet []string, bodies map[string][]string) bool {
	if len(snippet) == 0 {
		return false
	}
	for _, body := range bodies {
	start:
		for i := range body {
			first := body[i]
			if !strings.HasSuffix(first, snippet[0]) {
				continue
			}
			prefix := first[:len(first)-len(snippet[0])]
			if strings.TrimLeft(prefix, " \t") != "" || i+len(snippet) > len(body) {
				continue
			}
			for k, want := range snippet {
				got := body[i+k]
				if want == "" {
					if strings.TrimSpace(got) != "" {
						continue start
					}
				} else if got != prefix+want {
					continue start
				}
			}
			return true
		}
	}
	return false
}

// exampleDB is the database the examples use, and keep, on a server of
// one's own (docs/testing.md).
const exampleDB = "dlock_examples"

// TestExamplesDatabase: the examples write only to exampleDB, never to a
// database a user's server may hold, such as the README's "app": every
// Database call of an example file that names a database names exampleDB.
func TestExamplesDatabase(t *testing.T) {
	files, err := filepath.Glob("*example_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example files: %v", err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Database" || len(call.Args) == 0 {
				return true
			}
			if lit, ok := call.Args[0].(*ast.BasicLit); !ok || lit.Value != strconv.Quote(exampleDB) {
				t.Errorf("%s: Database(%s): the examples use %q", fset.Position(call.Pos()), types.ExprString(call.Args[0]), exampleDB)
			}
			return true
		})
	}
}
